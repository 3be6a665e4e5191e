//! Closing the host to sandboxes: the host's own firewall rules for each
//! session network's bridge.
//!
//! A session network is `internal`, so the engine drops what a sandbox
//! sends to be *forwarded*; but its gateway address is the host's (the
//! proxy listens there), and what is addressed to the host goes through
//! the host's INPUT chain, which the engine leaves alone. Without rules
//! there, a sandbox reaches every host service listening on `0.0.0.0` or a
//! host address (Postgres, the API, sshd).
//!
//! Where the worker can (it shares the host's network namespace and holds
//! `CAP_NET_ADMIN`, and an `iptables` binary is there), it adds for each
//! session network, in a chain of Kiln's own ([`CHAIN`], jumped to from
//! INPUT for `-i kiln+`), a rule accepting TCP from the network's subnet to
//! the proxy's address and port, and one dropping everything else arriving
//! from that bridge. Both carry the comment `kiln:<network id>`, which is
//! how they are found again: when the network goes, and when a worker
//! starts or stops and sweeps away rules of bridges that no longer exist.
//! The id is the engine's, never reused: a session's network has the same
//! name and bridge each time it is made, so a follow-up's network can
//! appear between the removal of its predecessor and of the predecessor's
//! rules, and rules found by name would take the successor's along.
//! Nothing else in any chain is ever touched, so workers (and tests) side
//! by side never undo one another's rules.
//!
//! The binary is run with fixed arguments (never through a shell). A crate
//! (`iptables`) would run the same binary, but blocking and with untyped
//! errors.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;
use tokio::sync::OnceCell;

/// Kiln's chain in the `filter` table, jumped to from INPUT.
pub const CHAIN: &str = "KILN-SANDBOX-INPUT";

/// The interfaces the jump from INPUT covers: every session network's
/// bridge (`sandbox::docker::network::BRIDGE_PREFIX`).
const BRIDGES: &str = "kiln+";

/// What the rules' comments start with.
const COMMENT_PREFIX: &str = "kiln:";

/// The binaries tried, in order: the host's `iptables` (whichever backend
/// it is), then the nft one by name; absolute paths for a `PATH` without
/// `/usr/sbin`.
const BINARIES: &[&str] =
    &["iptables", "/usr/sbin/iptables", "/sbin/iptables", "iptables-nft", "/usr/sbin/iptables-nft"];

/// How long one call may take, the wait for the xtables lock included.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Seconds an `iptables` call waits for the xtables lock another program
/// (the Docker engine, another worker) holds.
const LOCK_WAIT_S: &str = "10";

/// `KILN_EGRESS_HOST_FIREWALL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FirewallSetting {
    /// Manage the rules when the worker can; otherwise say at start that
    /// the host is open to sandboxes, and how to close it.
    Auto,
    /// Manage the rules; a run with egress whose rules cannot be installed
    /// fails.
    On,
    /// Never touch the host's firewall (the operator's own rules, or none).
    Off,
}

impl std::str::FromStr for FirewallSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(FirewallSetting::Auto),
            "on" => Ok(FirewallSetting::On),
            "off" => Ok(FirewallSetting::Off),
            _ => Err(format!("{s:?}: must be auto, on or off")),
        }
    }
}

impl FirewallSetting {
    pub fn as_str(self) -> &'static str {
        match self {
            FirewallSetting::Auto => "auto",
            FirewallSetting::On => "on",
            FirewallSetting::Off => "off",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    #[error("no iptables binary found (tried {})", BINARIES.join(", "))]
    NoBinary,
    #[error("running {binary}: {source}")]
    Spawn { binary: String, source: std::io::Error },
    #[error("`{binary} {args}` failed ({status}): {stderr}")]
    Failed { binary: String, args: String, status: std::process::ExitStatus, stderr: String },
    #[error("`{binary} {args}` did not finish within {CALL_TIMEOUT:?}")]
    TimedOut { binary: String, args: String },
    /// The worker has firewall rights, but in a network namespace of its
    /// own (a container without `network_mode: host`): rules there would
    /// not protect the host.
    #[error(
        "the bridge {0} is not an interface in the worker's network namespace: the worker must share the Docker host's network"
    )]
    BridgeNotHere(String),
    /// `KILN_EGRESS_HOST_FIREWALL=on`, and the worker cannot manage the
    /// host's firewall.
    #[error(
        "KILN_EGRESS_HOST_FIREWALL=on, but the worker cannot manage the host's firewall ({0}); a run with egress is refused rather than leave the host open to its sandbox"
    )]
    Required(String),
}

/// A session network's rules: which bridge, whose, and what the proxy
/// listens on.
#[derive(Debug, Clone)]
pub struct BridgeRules<'a> {
    /// The Docker network's id (the rules' comment): never its name, which
    /// the session's next network has too.
    pub network_id: &'a str,
    /// Its host-side bridge interface.
    pub bridge: &'a str,
    /// Its IPv4 subnet (the only addresses a sandbox on it has).
    pub subnet: &'a str,
    /// Where the proxy listens: the gateway address and the port.
    pub gateway: std::net::Ipv4Addr,
    pub port: u16,
}

impl BridgeRules<'_> {
    fn comment(&self) -> String {
        format!("{COMMENT_PREFIX}{}", self.network_id)
    }

    /// The rule letting the sandbox's TCP reach the proxy, and nothing else.
    fn accept(&self) -> Vec<String> {
        let mut rule = vec!["-i".into(), self.bridge.into(), "-s".into(), self.subnet.into()];
        rule.extend(["-d".into(), format!("{}/32", self.gateway), "-p".into(), "tcp".into()]);
        rule.extend(["--dport".into(), self.port.to_string()]);
        rule.extend(["-m".into(), "comment".into(), "--comment".into(), self.comment(), "-j".into(), "ACCEPT".into()]);
        rule
    }

    /// The rule dropping everything else the bridge sends the host.
    fn drop(&self) -> Vec<String> {
        let mut rule = vec!["-i".into(), self.bridge.into()];
        rule.extend(["-m".into(), "comment".into(), "--comment".into(), self.comment(), "-j".into(), "DROP".into()]);
        rule
    }
}

/// The host's firewall as this worker may use it: the setting, and (found
/// on first use) whether it can.
#[derive(Debug)]
pub struct HostFirewall {
    setting: FirewallSetting,
    /// The binary that answered, or why none could be used.
    probed: OnceCell<Result<String, String>>,
}

impl Default for HostFirewall {
    /// Never touches the firewall: what a library default should do.
    fn default() -> Self {
        HostFirewall::new(FirewallSetting::Off)
    }
}

impl HostFirewall {
    pub fn new(setting: FirewallSetting) -> Self {
        HostFirewall { setting, probed: OnceCell::new() }
    }

    pub fn setting(&self) -> FirewallSetting {
        self.setting
    }

    /// The binary to use, if this worker manages the firewall; `Err`: why it
    /// cannot (with `off`: never asked).
    async fn binary(&self) -> Result<&str, &str> {
        if self.setting == FirewallSetting::Off {
            return Err("KILN_EGRESS_HOST_FIREWALL=off");
        }
        self.probed.get_or_init(probe).await.as_deref().map_err(String::as_str)
    }

    /// Whether this worker installs rules (probing if not done yet).
    pub async fn managed(&self) -> bool {
        self.binary().await.is_ok()
    }

    /// Says at the worker's start what protects the host from sandboxes
    /// with egress (`egress`: the deployment allows any; `port`: the
    /// proxy's): the rules this worker keeps, or, loudly, that nothing does
    /// and how to close it. Also sweeps rules a worker left for bridges that
    /// are gone.
    pub async fn announce(&self, egress: bool, port: u16) {
        let why = match self.binary().await {
            Ok(binary) => {
                self.sweep().await;
                if egress {
                    tracing::info!(
                        binary,
                        chain = CHAIN,
                        "sandboxes with egress reach only the proxy on this host: the worker keeps firewall rules per session network"
                    );
                }
                return;
            }
            Err(why) => why,
        };
        match self.setting {
            // The operator said the host is protected otherwise.
            FirewallSetting::Off => {}
            _ if !egress => {}
            FirewallSetting::On => tracing::error!(
                why,
                "KILN_EGRESS_HOST_FIREWALL=on but the worker cannot manage the host's firewall: every run with egress will be refused"
            ),
            FirewallSetting::Auto => tracing::warn!(
                why,
                "sandboxes with egress can reach every service this host listens on at 0.0.0.0 or a host address \
                 (Postgres, the API, sshd), and the worker cannot close that itself (it needs the host's network namespace, \
                 CAP_NET_ADMIN and iptables). Close it with: iptables -I INPUT -i kiln+ -p tcp --dport {port} -j ACCEPT; \
                 iptables -I INPUT 2 -i kiln+ -j DROP (docs/deployment.md, Egress), \
                 or set KILN_EGRESS_HOST_FIREWALL=off to say the host is protected otherwise"
            ),
        }
    }

    /// Installs the network's rules (idempotent: a rule already there is
    /// not added twice). With `auto` and no rights, does nothing (the start
    /// said so); with `on`, an error.
    pub async fn protect(&self, rules: &BridgeRules<'_>) -> Result<(), FirewallError> {
        let binary = match self.binary().await {
            Ok(binary) => binary,
            Err(_) if self.setting != FirewallSetting::On => return Ok(()),
            Err(why) => return Err(FirewallError::Required(why.to_owned())),
        };
        if !Path::new("/sys/class/net").join(rules.bridge).exists() {
            let error = FirewallError::BridgeNotHere(rules.bridge.to_owned());
            if self.setting == FirewallSetting::On {
                return Err(error);
            }
            tracing::warn!(network_id = rules.network_id, %error, "the host stays open to this network's sandbox");
            return Ok(());
        }
        let installed = install(binary, rules).await;
        match installed {
            Err(e) if self.setting == FirewallSetting::Auto => {
                tracing::warn!(network_id = rules.network_id, error = %e, "installing the host's firewall rules failed; the host stays open to this network's sandbox");
                Ok(())
            }
            other => other,
        }
    }

    /// Removes the rules of the network whose id is `network_id`, wherever
    /// they are in [`CHAIN`]. Failures are logged: a rule left behind is
    /// swept at the next start.
    pub async fn unprotect(&self, network_id: &str) {
        let Ok(binary) = self.binary().await else { return };
        let comment = format!("{COMMENT_PREFIX}{network_id}");
        if let Err(e) = delete_where(binary, |rule| rule.comment.as_deref() == Some(comment.as_str())).await {
            tracing::warn!(network_id, error = %e, "removing the network's host firewall rules failed");
        }
    }

    /// Removes Kiln's rules on `rules`' bridge that belong to another
    /// network than `rules`' (a predecessor of the same name whose rules
    /// were left behind): a bridge is one network's at a time.
    pub async fn unprotect_others_on(&self, rules: &BridgeRules<'_>) {
        let Ok(binary) = self.binary().await else { return };
        let mine = rules.comment();
        let stale = |rule: &ListedRule| {
            rule.interface.as_deref() == Some(rules.bridge)
                && rule.comment.as_deref().is_some_and(|c| c.starts_with(COMMENT_PREFIX) && c != mine)
        };
        if let Err(e) = delete_where(binary, stale).await {
            tracing::warn!(network_id = rules.network_id, error = %e, "removing a predecessor's host firewall rules failed");
        }
    }

    /// Removes Kiln's rules of bridges that no longer exist (a worker that
    /// died before removing them, or networks removed by hand).
    pub async fn sweep(&self) {
        let Ok(binary) = self.binary().await else { return };
        let gone = |rule: &ListedRule| {
            rule.comment.as_deref().is_some_and(|c| c.starts_with(COMMENT_PREFIX))
                && rule.interface.as_deref().is_some_and(|i| !Path::new("/sys/class/net").join(i).exists())
        };
        if let Err(e) = delete_where(binary, gone).await {
            tracing::warn!(error = %e, "sweeping stale host firewall rules failed");
        }
    }
}

/// The first binary that lists INPUT: it exists and the worker may use it.
async fn probe() -> Result<String, String> {
    for binary in BINARIES {
        match run(binary, &["-S", "INPUT"]).await {
            Ok(_) => return Ok((*binary).to_owned()),
            Err(FirewallError::Spawn { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
            // Found but refused (no CAP_NET_ADMIN): another binary will not do better.
            Err(e) => return Err(e.to_string()),
        }
    }
    Err(FirewallError::NoBinary.to_string())
}

async fn install(binary: &str, rules: &BridgeRules<'_>) -> Result<(), FirewallError> {
    ensure_chain(binary).await?;
    // The accept goes first in the chain, the drop last: whatever order
    // rules of many networks arrive in, a network's accept precedes its drop.
    ensure_rule(binary, &rules.accept(), &["-I", CHAIN, "1"]).await?;
    ensure_rule(binary, &rules.drop(), &["-A", CHAIN]).await
}

/// Kiln's chain and the jump to it from INPUT, each made if missing.
async fn ensure_chain(binary: &str) -> Result<(), FirewallError> {
    if run(binary, &["-S", CHAIN]).await.is_err() {
        // Another worker may make it at the same moment: it is there either way.
        if let Err(e) = run(binary, &["-N", CHAIN]).await {
            run(binary, &["-S", CHAIN]).await.map_err(|_| e)?;
        }
    }
    let jump = ["-i", BRIDGES, "-j", CHAIN];
    if !exists(binary, "INPUT", &jump).await? {
        // First in INPUT: an earlier ACCEPT (established, a port opened to
        // everyone) must not let the bridges' traffic past Kiln's rules.
        let mut args = vec!["-I", "INPUT", "1"];
        args.extend(jump);
        run(binary, &args).await?;
    }
    Ok(())
}

/// Adds `rule` with `add` (`-I CHAIN 1` or `-A CHAIN`) unless it is there.
async fn ensure_rule(binary: &str, rule: &[String], add: &[&str]) -> Result<(), FirewallError> {
    let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
    if exists(binary, CHAIN, &rule).await? {
        return Ok(());
    }
    let mut args = add.to_vec();
    args.extend(rule);
    run(binary, &args).await.map(drop)
}

/// `-C`: exit 0, the rule is there; 1, it is not; anything else, an error.
async fn exists(binary: &str, chain: &str, rule: &[&str]) -> Result<bool, FirewallError> {
    let mut args = vec!["-C", chain];
    args.extend(rule);
    match run(binary, &args).await {
        Ok(_) => Ok(true),
        Err(FirewallError::Failed { status, .. }) if status.code() == Some(1) => Ok(false),
        Err(e) => Err(e),
    }
}

/// One rule of `-S CHAIN`, as far as Kiln reads it.
#[derive(Debug, PartialEq, Eq)]
struct ListedRule {
    /// The rule's specification, without the leading `-A CHAIN`.
    spec: Vec<String>,
    interface: Option<String>,
    comment: Option<String>,
}

/// Parses `-S CHAIN` output: `-A CHAIN spec…` lines (the `-N CHAIN` line
/// and anything else are skipped). Comments are printed quoted by some
/// versions; Kiln's hold no spaces, so splitting on whitespace is exact
/// for them (other rules are never deleted, so never need to be).
fn parse_rules(listing: &str) -> Vec<ListedRule> {
    let mut rules = Vec::new();
    for line in listing.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("-A") || words.next() != Some(CHAIN) {
            continue;
        }
        let spec: Vec<String> = words.map(|w| w.trim_matches('"').to_owned()).collect();
        let after = |flag: &str| spec.iter().position(|w| w == flag).and_then(|i| spec.get(i + 1)).cloned();
        rules.push(ListedRule { interface: after("-i"), comment: after("--comment"), spec });
    }
    rules
}

/// Deletes the rules of [`CHAIN`] that `which` picks. A rule gone
/// meanwhile (another worker's sweep) is not an error.
async fn delete_where(binary: &str, which: impl Fn(&ListedRule) -> bool) -> Result<(), FirewallError> {
    let listing = match run(binary, &["-S", CHAIN]).await {
        Ok(listing) => listing,
        // No chain: no rules of Kiln's.
        Err(FirewallError::Failed { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    for rule in parse_rules(&listing).iter().filter(|r| which(r)) {
        let mut args = vec!["-D", CHAIN];
        args.extend(rule.spec.iter().map(String::as_str));
        match run(binary, &args).await {
            Ok(_) => tracing::debug!(rule = ?rule.spec, "removed host firewall rule"),
            Err(FirewallError::Failed { stderr, .. }) => tracing::debug!(stderr, "host firewall rule already gone"),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Runs `binary -w LOCK_WAIT_S args…`; its standard output on success.
async fn run(binary: &str, args: &[&str]) -> Result<String, FirewallError> {
    let mut command = Command::new(binary);
    command.arg("-w").arg(LOCK_WAIT_S).args(args);
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let shown = || args.join(" ");
    let output = match tokio::time::timeout(CALL_TIMEOUT, command.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(source)) => return Err(FirewallError::Spawn { binary: binary.to_owned(), source }),
        Err(_) => return Err(FirewallError::TimedOut { binary: binary.to_owned(), args: shown() }),
    };
    if !output.status.success() {
        // Bounded: an error message, not a log.
        let stderr = String::from_utf8_lossy(&output.stderr).chars().take(500).collect::<String>().trim().to_owned();
        return Err(FirewallError::Failed { binary: binary.to_owned(), args: shown(), status: output.status, stderr });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> BridgeRules<'static> {
        BridgeRules {
            network_id: "0123",
            bridge: "kiln0123456789a",
            subnet: "172.30.0.0/16",
            gateway: std::net::Ipv4Addr::new(172, 30, 0, 1),
            port: 3128,
        }
    }

    #[test]
    fn a_listing_gives_back_kilns_rules_as_they_can_be_deleted() {
        let listing = format!(
            "-N {CHAIN}\n\
             -A {CHAIN} -s 172.30.0.0/16 -d 172.30.0.1/32 -i kiln0123456789a -p tcp -m comment --comment \"kiln:0123\" -m tcp --dport 3128 -j ACCEPT\n\
             -A {CHAIN} -i kiln0123456789a -m comment --comment kiln:0123 -j DROP\n\
             -A INPUT -i kiln+ -j {CHAIN}\n"
        );
        let parsed = parse_rules(&listing);
        assert_eq!(parsed.len(), 2);
        for rule in &parsed {
            assert_eq!(rule.interface.as_deref(), Some("kiln0123456789a"));
            assert_eq!(rule.comment.as_deref(), Some("kiln:0123"));
        }
        assert_eq!(parsed[1].spec, rules().drop());
    }

    #[test]
    fn the_accept_names_the_proxy_alone() {
        let accept = rules().accept().join(" ");
        assert_eq!(
            accept,
            "-i kiln0123456789a -s 172.30.0.0/16 -d 172.30.0.1/32 -p tcp --dport 3128 -m comment --comment kiln:0123 -j ACCEPT"
        );
    }

    /// A bridge the worker cannot see (here: none of that name) is a run's
    /// failure with `on` (whether or not this process has firewall rights),
    /// a warning with `auto`, and never touched with `off`.
    #[tokio::test]
    async fn a_bridge_that_cannot_be_closed_fails_only_with_on() {
        let rules = rules();
        let on = HostFirewall::new(FirewallSetting::On).protect(&rules).await;
        assert!(matches!(on, Err(FirewallError::BridgeNotHere(_) | FirewallError::Required(_))), "{on:?}");
        assert!(HostFirewall::new(FirewallSetting::Auto).protect(&rules).await.is_ok());
        let off = HostFirewall::new(FirewallSetting::Off);
        assert!(off.protect(&rules).await.is_ok());
        assert!(!off.managed().await);
    }

    #[test]
    fn the_setting_parses() {
        assert_eq!("auto".parse(), Ok(FirewallSetting::Auto));
        assert_eq!("on".parse(), Ok(FirewallSetting::On));
        assert_eq!("off".parse(), Ok(FirewallSetting::Off));
        assert!("yes".parse::<FirewallSetting>().is_err());
    }
}
