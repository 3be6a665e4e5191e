//! Egress through Kiln's proxy (issue 16): a sandbox reaches what its
//! policy allows and nothing else, has no way around the proxy, and every
//! refusal is a `network.denied` event of its run.
//!
//! "The internet" is one test server in a container on a network the test
//! creates (`kiln_tests::outside`); the proxy knows it under several names
//! (`KILN_EGRESS_HOSTS`) and the test allows its network's range, as an
//! operator would allow an internal registry. No traffic leaves the machine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bollard::query_parameters::RemoveImageOptionsBuilder;
use kiln_protocol::egress::{EgressMode, EgressPolicy, HostRule};
use kiln_protocol::{ApprovalMode, CreateRun, EventBody, RunStatus, SandboxSpec};
use kiln_scripted_model::Reply;
use kiln_tests::outside::{HTTP_PORT, HTTPS_PORT, INDEX_GREETING, Outside};
use kiln_tests::{Event, Options, TestApp, kinds, outcome, pick, token, worker_config};
use kiln_worker::ProviderKind;
use kiln_worker::egress::host_firewall::{CHAIN, FirewallSetting, HostFirewall};
use kiln_worker::egress::resolve::{parse_hosts, parse_ranges};
use kiln_worker::egress::{AddressRules, EgressSettings};
use serde_json::json;

/// What the sandbox tries, one line of result each. Placeholders: `@IP@`,
/// the test server's address.
const PROBE: &str = r#"
import os, socket, ssl, urllib.request, fcntl, struct
unverified = ssl._create_unverified_context()
def get(url, method='GET'):
    try:
        req = urllib.request.Request(url, method=method, data=b'x' if method == 'POST' else None)
        with urllib.request.urlopen(req, context=unverified, timeout=20) as r:
            return 'OK ' + r.read().decode()
    except urllib.error.HTTPError as e:
        return 'HTTP %d' % e.code
    except Exception as e:
        return 'ERR ' + type(e).__name__
def tunnel(host, sni):
    proxy = os.environ['HTTPS_PROXY'].split('//')[1].split(':')
    s = socket.create_connection((proxy[0], int(proxy[1])), timeout=20)
    s.sendall(('CONNECT %s:8443 HTTP/1.1\r\nHost: %s:8443\r\n\r\n' % (host, host)).encode())
    status = s.recv(4096).split(b'\r\n')[0].decode()
    if ' 200' not in status:
        return 'REFUSED ' + status
    try:
        t = unverified.wrap_socket(s, server_hostname=sni)
        t.sendall(b'GET /tunnel HTTP/1.0\r\nHost: allowed.test\r\n\r\n')
        return 'OK ' + t.recv(4096).decode().split('\r\n')[0]
    except Exception as e:
        return 'ERR ' + type(e).__name__
results = [
    ('http-allowed', get('http://allowed.test:8080/plain')),
    ('https-allowed', get('https://allowed.test:8443/secure')),
    ('http-blocked', get('http://blocked.test:8080/x')),
    ('https-blocked', get('https://blocked.test:8443/x')),
    ('redirect', get('http://allowed.test:8080/redirect?to=http://redirected.test:8080/loot')),
    ('method', get('http://readonly.test:8080/simple/pkg', 'POST')),
    ('path', get('http://readonly.test:8080/admin')),
    ('method-path-ok', get('http://readonly.test:8080/simple/pkg')),
    ('readonly-https', tunnel('readonly.test', 'readonly.test')),
    ('private', get('http://private.test:8080/')),
    ('sni-mismatch', tunnel('allowed.test', 'blocked.test')),
    ('sni-missing', tunnel('allowed.test', None)),
]
try:
    socket.create_connection(('@IP@', 8080), timeout=5); results.append(('direct', 'CONNECTED'))
except Exception as e:
    results.append(('direct', 'ERR ' + type(e).__name__))
try:
    socket.getaddrinfo('allowed.test', 8080); results.append(('dns', 'RESOLVED'))
except Exception as e:
    results.append(('dns', 'ERR ' + type(e).__name__))
# From /proc/net/dev, which gVisor has too (its /sys has no class/net).
ifname = [n for n in (l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]) if n != 'lo'][0].encode()
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for name, req, arg in [('link-down', 0x8914, struct.pack('16sH14s', ifname, 0, b'')),
                       ('route-add', 0x890B, bytes(120))]:
    try:
        fcntl.ioctl(sock, req, arg); results.append((name, 'CHANGED'))
    except OSError as e:
        results.append((name, 'ERRNO %d' % e.errno))
for name, result in results:
    print('%s: %s' % (name, result))
"#;

fn bash_python(script: &str) -> serde_json::Value {
    json!({ "command": format!("python3 - <<'PY'\n{script}\nPY") })
}

/// The deployment: `mode` at most, the test's names on the test server,
/// its network's range allowed.
fn settings(outside: &Outside, mode: EgressMode) -> EgressSettings {
    let ip = outside.ip;
    let hosts = format!(
        "allowed.test={ip},blocked.test={ip},redirected.test={ip},readonly.test={ip},\
         private.test=127.0.0.1,metadata.test=169.254.169.254"
    );
    let allowed = HostRule::host("allowed.test", vec![HTTP_PORT, HTTPS_PORT]);
    let read_only = HostRule {
        methods: Some(vec!["GET".into(), "HEAD".into()]),
        path_prefixes: Some(vec!["/simple/".into()]),
        ..HostRule::host("readonly.test", vec![HTTP_PORT, HTTPS_PORT])
    };
    let private = HostRule::host("private.test", vec![HTTP_PORT]);
    EgressSettings {
        deployment: EgressPolicy { mode, allow: Some(vec![allowed, read_only, private]) },
        addresses: Arc::new(AddressRules {
            allow_ranges: parse_ranges(&outside.subnet).unwrap(),
            deny_ranges: Vec::new(),
            hosts: parse_hosts(&hosts).unwrap(),
        }),
        ..EgressSettings::default()
    }
}

async fn app_with(outside: &Outside, mode: EgressMode, script: Vec<Reply>) -> TestApp {
    let app = TestApp::spawn(Options { worker: false, script, ..Default::default() }).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.sandbox.egress = Arc::new(settings(outside, mode));
    app.start_worker(config).await;
    app
}

fn egress(policy: EgressPolicy) -> Option<SandboxSpec> {
    Some(SandboxSpec { egress: Some(policy), ..Default::default() })
}

async fn run(app: &TestApp, sandbox: Option<SandboxSpec>) -> Vec<Event> {
    let id = app.submit("alice", CreateRun { sandbox, ..CreateRun::new("x") }).await.id;
    app.events("alice", id).await
}

/// The probe's lines as `(name, result)`.
fn results(events: &[Event]) -> Vec<(String, String)> {
    let output = pick!(events, EventBody::ToolResult { output, .. } => output).next();
    let output = output.unwrap_or_else(|| panic!("{:?}", kinds(events)));
    output
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(name, result)| (name.to_owned(), result.to_owned()))
        .collect()
}

fn result<'a>(results: &'a [(String, String)], name: &str) -> &'a str {
    results.iter().find(|(n, _)| n == name).map(|(_, r)| r.as_str()).unwrap_or_else(|| panic!("no {name}: {results:?}"))
}

/// Every `network.denied` of the run as `(host, port, method, layer, rule)`.
fn denials(events: &[Event]) -> Vec<(String, u16, Option<String>, String, String)> {
    pick!(events, EventBody::NetworkDenied { host, port, method, layer, rule, .. } =>
        (host.clone(), *port, method.clone(), layer.clone(), rule.clone()))
    .collect()
}

#[tokio::test]
async fn an_allowlist_lets_through_what_it_names_and_nothing_else() {
    let outside = Outside::start().await;
    let script =
        vec![Reply::tool("bash", bash_python(&PROBE.replace("@IP@", &outside.ip.to_string()))), Reply::text("done")];
    let app = app_with(&outside, EgressMode::Allowlist, script).await;
    let events = run(&app, egress(EgressPolicy { mode: EgressMode::Allowlist, allow: None })).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let got = results(&events);

    // Allowed, over HTTP and HTTPS (a tunnel whose SNI is the CONNECT host).
    assert_eq!(result(&got, "http-allowed"), "OK outside says GET /plain");
    assert_eq!(result(&got, "https-allowed"), "OK outside says GET /secure");
    assert_eq!(result(&got, "method-path-ok"), "OK outside says GET /simple/pkg");
    // Refused by name, by method, by path, and a redirect to a blocked host
    // (the client follows; the second request is judged on its own).
    for name in ["http-blocked", "redirect", "method", "path"] {
        assert_eq!(result(&got, name), "HTTP 403", "{name}: {got:?}");
    }
    assert!(result(&got, "https-blocked").starts_with("ERR"), "{got:?}");
    // A rule with methods or paths cannot be checked inside TLS: no tunnel.
    assert!(result(&got, "readonly-https").starts_with("REFUSED"), "{got:?}");
    // An allowed name resolving to loopback is refused before connecting.
    assert_eq!(result(&got, "private"), "HTTP 403");
    // A tunnel to allowed.test whose ClientHello names blocked.test, or
    // nothing, is closed before the server is dialled.
    assert!(result(&got, "sni-mismatch").starts_with("ERR"), "{got:?}");
    assert!(result(&got, "sni-missing").starts_with("ERR"), "{got:?}");

    // No way around the proxy: no route, no resolver, no capability.
    assert!(result(&got, "direct").starts_with("ERR"), "{got:?}");
    assert!(result(&got, "dns").starts_with("ERR"), "{got:?}");
    // Under runc the kernel refuses without CAP_NET_ADMIN (EPERM); gVisor
    // in host network mode has no such ioctls at all (ENOTTY).
    let refused = match kiln_tests::sandbox_runtime().as_deref() {
        Some("runsc") => "ERRNO 25",
        _ => "ERRNO 1",
    };
    assert_eq!(result(&got, "link-down"), refused, "{got:?}");
    assert_eq!(result(&got, "route-add"), refused, "{got:?}");

    // Every refusal is an event naming the host and the rule.
    let denied = denials(&events);
    let find = |host: &str, port: u16| {
        denied.iter().find(|d| d.0 == host && d.1 == port).unwrap_or_else(|| panic!("no denial of {host}: {denied:?}"))
    };
    let d = find("blocked.test", HTTP_PORT);
    assert_eq!(
        (d.2.as_deref(), d.3.as_str(), d.4.as_str()),
        (Some("GET"), "deployment", "allowlist: no rule for blocked.test:8080")
    );
    let d = find("blocked.test", HTTPS_PORT);
    assert_eq!((d.2.as_deref(), d.3.as_str()), (None, "deployment"));
    let d = find("redirected.test", HTTP_PORT);
    assert_eq!(d.4, "allowlist: no rule for redirected.test:8080");
    assert!(
        denied
            .iter()
            .any(|d| d.0 == "readonly.test" && d.2.as_deref() == Some("POST") && d.4.contains("methods GET,HEAD")),
        "{denied:?}"
    );
    assert!(denied.iter().any(|d| d.0 == "readonly.test" && d.4.contains("paths /simple/")), "{denied:?}");
    assert!(find("private.test", HTTP_PORT).4.contains("loopback"), "{denied:?}");
    // The mismatch is named after the name the client asked the server for.
    assert!(
        denied.iter().any(|d| d.0 == "blocked.test" && d.3 == "proxy" && d.4.contains("server name differs")),
        "{denied:?}"
    );
    assert!(denied.iter().any(|d| d.0 == "allowed.test" && d.4.contains("no server name")), "{denied:?}");
    let allowed: Vec<_> = pick!(&events, EventBody::NetworkAllowed { host, port } => (host.clone(), *port)).collect();
    assert!(allowed.contains(&("allowed.test".to_owned(), HTTP_PORT)), "{allowed:?}");
    assert!(allowed.contains(&("allowed.test".to_owned(), HTTPS_PORT)), "{allowed:?}");

    drop(app);
    outside.stop().await;
}

/// Request targets sent to the proxy byte for byte (no client library
/// tidies them first), one line of result each: `name: status body`.
const PATH_PROBE: &str = r#"
import os, socket
proxy = os.environ['HTTP_PROXY'].split('//')[1].split(':')
def send(target):
    s = socket.create_connection((proxy[0], int(proxy[1])), timeout=20)
    s.sendall(('GET %s HTTP/1.1\r\nHost: readonly.test:8080\r\nConnection: close\r\n\r\n' % target).encode())
    answer = b''
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        answer += chunk
    head, _, body = answer.partition(b'\r\n\r\n')
    return head.split(b'\r\n')[0].decode().split(' ')[1] + ' ' + body.decode().strip()
base = 'http://readonly.test:8080'
for name, path in [
    ('ok', '/simple/ok'),
    ('dot-dot', '/simple/../admin'),
    ('encoded-dots', '/simple/%2e%2e/admin'),
    ('encoded-dots-upper', '/simple/%2E%2E/admin'),
    ('half-encoded', '/simple/.%2e/admin'),
    ('encoded-slash', '/simple/..%2fadmin'),
    ('double-encoded', '/simple/%252e%252e/admin'),
    ('backslash', '/simple/..\\admin'),
    ('parameter', '/simple/..;/admin'),
    ('nul', '/simple/%00/admin'),
    ('inside', '/simple/x/../ok'),
    ('unreserved', '/%73imple/ok'),
    ('query', '/simple/ok?next=/../admin'),
    ('fragment', '/simple/ok#/../../admin'),
]:
    print('%s: %s' % (name, send(base + path)))
"#;

/// `path_prefixes` judge the path as origins read it: dot segments
/// resolved (`/simple/../admin` is `/admin`), and encodings servers read
/// differently (`%2e`, `%2f`, `%25`, `\`, `..;`, `%00`) refused outright,
/// each with a `network.denied` event; what passes reaches the origin in
/// the form it was judged in.
#[tokio::test]
async fn path_rules_judge_the_normalised_path_and_refuse_ambiguous_encodings() {
    let outside = Outside::start().await;
    let script = vec![Reply::tool("bash", bash_python(PATH_PROBE)), Reply::text("done")];
    let app = app_with(&outside, EgressMode::Allowlist, script).await;
    let events = run(&app, egress(EgressPolicy { mode: EgressMode::Allowlist, allow: None })).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let got = results(&events);

    assert_eq!(result(&got, "ok"), "200 outside says GET /simple/ok", "{got:?}");
    // What passes is sent normalised: the origin sees the path judged.
    assert_eq!(result(&got, "inside"), "200 outside says GET /simple/ok", "{got:?}");
    assert_eq!(result(&got, "unreserved"), "200 outside says GET /simple/ok", "{got:?}");
    // The query is not a path: sent as it came. A fragment never leaves.
    assert_eq!(result(&got, "query"), "200 outside says GET /simple/ok?next=/../admin", "{got:?}");
    assert_eq!(result(&got, "fragment"), "200 outside says GET /simple/ok", "{got:?}");
    let refused = [
        "dot-dot",
        "encoded-dots",
        "encoded-dots-upper",
        "half-encoded",
        "encoded-slash",
        "double-encoded",
        "backslash",
        "parameter",
        "nul",
    ];
    for name in refused {
        assert!(result(&got, name).starts_with("403 kiln egress proxy: refused readonly.test:8080"), "{name}: {got:?}");
    }

    // One refusal event each, saying why; none quotes the path.
    let denied: Vec<_> = denials(&events).into_iter().filter(|d| d.0 == "readonly.test").collect();
    assert_eq!(denied.len(), refused.len(), "{denied:?}");
    let rules: Vec<&str> = denied.iter().map(|d| d.4.as_str()).collect();
    assert_eq!(rules[0], "readonly.test: paths /simple/", "{rules:?}");
    assert_eq!(rules[1], "readonly.test: path refused: an encoded dot (%2E): servers differ on decoding it");
    assert!(rules.iter().any(|r| r.contains("encoded slash (%2F)")), "{rules:?}");
    assert!(rules.iter().any(|r| r.contains("double encoding (%25)")), "{rules:?}");
    assert!(rules.iter().any(|r| r.contains("backslash")), "{rules:?}");
    assert!(rules.iter().any(|r| r.contains("path parameter")), "{rules:?}");
    assert!(rules.iter().all(|r| !r.contains("admin")), "{rules:?}");
    assert!(denied.iter().all(|d| d.2.as_deref() == Some("GET") && d.3 == "deployment"), "{denied:?}");

    drop(app);
    outside.stop().await;
}

#[tokio::test]
async fn open_mode_reaches_public_names_but_never_metadata_and_a_run_only_narrows() {
    let outside = Outside::start().await;
    let probe = r#"
import urllib.request
def get(url):
    try:
        with urllib.request.urlopen(url, timeout=20) as r: return 'OK ' + r.read().decode()
    except urllib.error.HTTPError as e: return 'HTTP %d' % e.code
    except Exception as e: return 'ERR ' + type(e).__name__
for name, url in [('blocked', 'http://blocked.test:8080/x'), ('metadata', 'http://metadata.test/latest/meta-data/'),
                  ('allowed', 'http://allowed.test:8080/y')]:
    print('%s: %s' % (name, get(url)))
"#;
    let script = vec![
        Reply::tool("bash", bash_python(probe)),
        Reply::text("open"),
        Reply::tool("bash", bash_python(probe)),
        Reply::text("narrowed"),
        Reply::tool("bash", bash_python(probe)),
        Reply::text("none"),
    ];
    let app = app_with(&outside, EgressMode::Open, script).await;

    // Open: any name, but metadata.test resolves to 169.254.169.254 and is
    // refused before any connection.
    let events = run(&app, egress(EgressPolicy { mode: EgressMode::Open, allow: None })).await;
    let got = results(&events);
    assert_eq!(result(&got, "blocked"), "OK outside says GET /x", "{got:?}");
    assert_eq!(result(&got, "metadata"), "HTTP 403", "{got:?}");
    let denied = denials(&events);
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert_eq!((denied[0].0.as_str(), denied[0].3.as_str()), ("metadata.test", "proxy"));
    assert!(denied[0].4.contains("link-local"), "{denied:?}");

    // A run narrows the open deployment to one host.
    let only_allowed = EgressPolicy {
        mode: EgressMode::Allowlist,
        allow: Some(vec![HostRule::host("allowed.test", vec![HTTP_PORT])]),
    };
    let events = run(&app, egress(only_allowed)).await;
    let got = results(&events);
    assert_eq!(result(&got, "allowed"), "OK outside says GET /y", "{got:?}");
    assert_eq!(result(&got, "blocked"), "HTTP 403", "{got:?}");
    let denied = denials(&events);
    assert!(denied.iter().any(|d| d.0 == "blocked.test" && d.3 == "run"), "{denied:?}");

    // No egress asked: no network at all (the proxy's variables are not even set).
    let events = run(&app, None).await;
    let got = results(&events);
    assert!(result(&got, "allowed").starts_with("ERR"), "{got:?}");
    assert!(denials(&events).is_empty());

    drop(app);
    outside.stop().await;
}

/// The worker's resident memory, in KiB (the worker runs in this process).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn four_sessions_at_once_each_see_only_their_own_traffic_under_load() {
    let outside = Outside::start().await;
    // Each sandbox tags its requests with its proxy's address (one network
    // per session, so one address per session): 25 fetches from
    // allowed.test and 25 from a blocked name of its own, all at once.
    let load = r#"
import os, time, threading, urllib.request
time.sleep(2)
tag = os.environ['HTTP_PROXY'].split('//')[1].split(':')[0].replace('.', '-')
results = []
def get(url):
    try:
        with urllib.request.urlopen(url, timeout=60) as r: results.append('ok' if r.read().startswith(b'outside says') else 'bad')
    except urllib.error.HTTPError as e: results.append('http%d' % e.code)
    except Exception as e: results.append(type(e).__name__)
urls = ['http://allowed.test:8080/%d' % i for i in range(25)] + ['http://blocked-%s.test:8080/%d' % (tag, i) for i in range(25)]
threads = [threading.Thread(target=get, args=(u,)) for u in urls]
for t in threads: t.start()
for t in threads: t.join()
print('tag: ' + tag)
print('ok: %d' % results.count('ok'))
print('refused: %d' % results.count('http403'))
print('other: %s' % sorted(r for r in results if r not in ('ok', 'http403')))
"#;
    let mut script: Vec<Reply> = (0..4).map(|_| Reply::tool("bash", bash_python(load))).collect();
    script.extend((0..4).map(|_| Reply::text("done")));
    let app = TestApp::spawn(Options { worker: false, script, ..Default::default() }).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.concurrency = 4;
    config.sandbox.egress = Arc::new(settings(&outside, EgressMode::Allowlist));
    app.start_worker(config).await;
    let before = rss_kib();

    let spec = egress(EgressPolicy { mode: EgressMode::Allowlist, allow: None });
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(app.submit("alice", CreateRun { sandbox: spec.clone(), ..CreateRun::new("x") }).await.id);
    }
    let runs = futures::future::join_all(ids.iter().map(|id| app.events("alice", *id))).await;
    let mut tags = Vec::new();
    for events in &runs {
        assert_eq!(outcome(events), Some(RunStatus::Succeeded), "{:?}", kinds(events));
        let got = results(events);
        assert_eq!(result(&got, "ok"), "25", "{got:?}");
        assert_eq!(result(&got, "refused"), "25", "{got:?}");
        assert_eq!(result(&got, "other"), "[]", "{got:?}");
        let tag = result(&got, "tag").to_owned();
        // This run's refusals, all of them and no other session's.
        let denied = denials(events);
        assert_eq!(denied.len(), 25, "{denied:?}");
        let own = format!("blocked-{tag}.test");
        assert!(denied.iter().all(|d| d.0 == own), "{own}: {denied:?}");
        tags.push(tag);
    }
    tags.sort();
    tags.dedup();
    assert_eq!(tags.len(), 4, "one network, and one proxy, per session: {tags:?}");
    // 200 connections through four proxies cost the worker little; a
    // generous bound that catches buffering bodies or leaking connections.
    let grown = rss_kib().saturating_sub(before);
    assert!(grown < 256 * 1024, "the worker grew by {grown} KiB");

    drop(app);
    outside.stop().await;
}

/// The agent phase's view: its interfaces, any proxy settings, the package
/// setup installed, and its attempts to reach the index. `@IP@`: the
/// index's address.
const AGENT_PHASE_PROBE: &str = r#"
echo "interfaces: $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ' ')"
echo "proxy-variables: $(env | grep -ci proxy)"
python3 - <<'PY'
import socket, urllib.request
try:
    import kilnpkg; print('import: ' + kilnpkg.GREETING)
except Exception as e:
    print('import: ERR %s' % e)
try:
    urllib.request.urlopen('http://index.test:8080/simple/', timeout=10); print('index: REACHED')
except Exception as e:
    print('index: ERR %s' % e)
try:
    socket.create_connection(('@IP@', 8080), timeout=5); print('direct: CONNECTED')
except Exception as e:
    print('direct: ERR %s' % e)
PY
"#;

/// The setup script: installs `kilnpkg` from the index by hand (the
/// sandbox image has no pip: the page, the wheel, its hash, unpacked into
/// the user's site-packages, which is what pip does for a pure wheel), then
/// tries a host its policy does not name.
const SETUP_INSTALLS_FROM_THE_INDEX: &str = r##"
python3 - <<'PY'
import hashlib, io, os, re, site, urllib.request, zipfile
base = 'http://index.test:8080/simple/kilnpkg/'
page = urllib.request.urlopen(base, timeout=30).read().decode()
href = re.search(r'href="([^"#]+)#sha256=([0-9a-f]+)"', page)
wheel = urllib.request.urlopen(base + href.group(1), timeout=30).read()
assert hashlib.sha256(wheel).hexdigest() == href.group(2), 'hash mismatch'
target = site.getusersitepackages()
os.makedirs(target, exist_ok=True)
zipfile.ZipFile(io.BytesIO(wheel)).extractall(target)
print('installed ' + href.group(1))
try:
    urllib.request.urlopen('http://blocked.test:8080/', timeout=30); print('blocked: REACHED')
except urllib.error.HTTPError as e:
    print('blocked: HTTP %d' % e.code)
PY
"##;

#[tokio::test]
async fn setup_installs_from_the_index_through_its_own_policy_and_the_agent_phase_has_no_network() {
    let index = Outside::start_index().await;
    let ip = index.ip;
    let probe = AGENT_PHASE_PROBE.replace("@IP@", &ip.to_string());
    let script = vec![
        Reply::tool("bash", json!({ "command": probe })),
        Reply::text("first"),
        Reply::tool("bash", json!({ "command": "true" })),
        Reply::text("second"),
    ];
    let app = TestApp::spawn(Options { worker: false, script, ..Default::default() }).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    // The deployment allows both names; the environment's setup only the index.
    config.sandbox.egress = Arc::new(EgressSettings {
        deployment: EgressPolicy {
            mode: EgressMode::Allowlist,
            allow: Some(vec![
                HostRule::host("index.test", vec![HTTP_PORT]),
                HostRule::host("blocked.test", vec![HTTP_PORT]),
            ]),
        },
        addresses: Arc::new(AddressRules {
            allow_ranges: parse_ranges(&index.subnet).unwrap(),
            deny_ranges: Vec::new(),
            hosts: parse_hosts(&format!("index.test={ip},blocked.test={ip}")).unwrap(),
        }),
        ..EgressSettings::default()
    });
    app.start_worker(config).await;
    let mut environment = json!({
        "name": "pyproj",
        "setup_script": SETUP_INSTALLS_FROM_THE_INDEX,
        "setup_sandbox": { "egress": { "mode": "allowlist", "allow": [{ "host": "index.test", "ports": [HTTP_PORT] }] } },
    });
    let (status, body) = app.post_json("alice", "/v1/environments", environment.clone()).await;
    assert_eq!(status, 201, "{body}");

    // The run names no egress of its own: the agent phase has none.
    let submitted = app.submit("alice", CreateRun { environment: Some("pyproj".into()), ..CreateRun::new("x") }).await;
    let events = app.events("alice", submitted.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let (key, hit) = pick!(&events, EventBody::EnvironmentStarted { cache_key, hit, .. } => (cache_key.clone(), *hit))
        .next()
        .unwrap();
    assert!(!hit);
    let setup: String = pick!(&events, EventBody::EnvironmentOutput { text, .. } => text.clone()).collect();
    assert!(setup.contains("installed kilnpkg-1.0-py3-none-any.whl"), "{setup}");
    assert!(setup.contains("blocked: HTTP 403"), "{setup}");

    // Setup's traffic went through its proxy, and its decisions are in the
    // run's stream, within the setup phase: the index allowed, the other
    // host refused by setup's own rule (the deployment allows it).
    let position = |kind: &str| events.iter().position(|e| e.kind() == kind).unwrap_or_else(|| panic!("no {kind}"));
    let (setup_start, setup_end) = (position("environment.started"), position("environment.finished"));
    let allowed = position("network.allowed");
    assert!(setup_start < allowed && allowed < setup_end, "{:?}", kinds(&events));
    let allowed: Vec<_> = pick!(&events, EventBody::NetworkAllowed { host, port } => (host.clone(), *port)).collect();
    assert_eq!(allowed, [("index.test".to_owned(), HTTP_PORT)]);
    let denied = denials(&events);
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert_eq!((denied[0].0.as_str(), denied[0].3.as_str()), ("blocked.test", "setup"), "{denied:?}");
    assert!(position("network.denied") < setup_end, "{:?}", kinds(&events));

    // The agent phase: loopback only, no proxy settings, the package there,
    // and the index out of reach (no name, no route), as the tool result shows.
    let got = results(&events);
    assert_eq!(result(&got, "interfaces").trim(), "lo", "{got:?}");
    assert_eq!(result(&got, "proxy-variables"), "0", "{got:?}");
    assert_eq!(result(&got, "import"), INDEX_GREETING, "{got:?}");
    assert!(result(&got, "index").starts_with("ERR"), "{got:?}");
    assert!(result(&got, "direct").starts_with("ERR"), "{got:?}");
    // Setup's network and proxy settings are gone: no session network is
    // left, and the prepared image carries no proxy variable.
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let network = kiln_worker::sandbox::docker::network::name(submitted.session_id);
    assert!(docker.inspect_network(&network, None).await.is_err(), "{network} is still there");
    let image = docker.inspect_image(&format!("kiln-env:{key}")).await.unwrap();
    let env = image.config.and_then(|c| c.env).unwrap_or_default();
    assert!(!env.iter().any(|v| v.to_ascii_lowercase().contains("proxy")), "{env:?}");

    // Another setup policy is another cache key: the next run sets up again.
    environment["setup_sandbox"]["egress"]["allow"][0]["methods"] = json!(["GET"]);
    let r = app.http.put(app.url("/v1/environments/pyproj")).bearer_auth(token("alice")).json(&environment);
    assert_eq!(r.send().await.unwrap().status(), 200);
    let second = app.submit("alice", CreateRun { environment: Some("pyproj".into()), ..CreateRun::new("x") }).await;
    let events = app.events("alice", second.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let (second_key, hit) =
        pick!(&events, EventBody::EnvironmentStarted { cache_key, hit, .. } => (cache_key.clone(), *hit))
            .next()
            .unwrap();
    assert!(!hit && second_key != key, "the changed setup policy must miss");

    for key in [key, second_key] {
        let _ = docker
            .remove_image(&format!("kiln-env:{key}"), Some(RemoveImageOptionsBuilder::new().force(true).build()), None)
            .await;
    }
    drop(app);
    index.stop().await;
}

/// `kiln-sandbox:latest` without a shell (no bash, no sh), under a tag of
/// its own: with no toolbox for the worker either, a sandbox of it is
/// created and started, then refused (nothing could run in it), after its
/// session's network was made.
async fn image_without_a_shell(docker: &bollard::Docker) -> String {
    use bollard::models::ContainerCreateBody;
    use bollard::query_parameters::{CommitContainerOptionsBuilder, WaitContainerOptionsBuilder};
    use futures::StreamExt;
    let tag = format!("kiln-test-nobash-egress:{}", uuid::Uuid::new_v4().simple());
    let body = ContainerCreateBody {
        image: Some("kiln-sandbox:latest".into()),
        user: Some("0:0".into()),
        cmd: Some(
            ["rm", "-f", "/usr/bin/bash", "/usr/bin/sh", "/usr/bin/dash", "/bin/bash", "/bin/sh", "/bin/dash"]
                .map(String::from)
                .to_vec(),
        ),
        network_disabled: Some(true),
        ..Default::default()
    };
    let container =
        docker.create_container(None::<bollard::query_parameters::CreateContainerOptions>, body).await.unwrap();
    docker.start_container(&container.id, None).await.unwrap();
    let waited = docker.wait_container(&container.id, Some(WaitContainerOptionsBuilder::new().build())).next().await;
    assert!(matches!(waited, Some(Ok(ref r)) if r.status_code == 0), "{waited:?}");
    let (repo, version) = tag.split_once(':').unwrap();
    let options = CommitContainerOptionsBuilder::new().container(&container.id).repo(repo).tag(version).build();
    docker.commit_container(options, bollard::models::ContainerConfig::default()).await.unwrap();
    let remove = bollard::query_parameters::RemoveContainerOptionsBuilder::new().force(true).v(true).build();
    docker.remove_container(&container.id, Some(remove)).await.unwrap();
    tag
}

#[tokio::test]
async fn a_sandbox_that_fails_to_start_leaves_no_network_behind() {
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let image = image_without_a_shell(&docker).await;
    let outside = Outside::start().await;
    let script = vec![Reply::text("never asked")];
    let app = TestApp::spawn(Options { worker: false, script, ..Default::default() }).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.sandbox.egress = Arc::new(settings(&outside, EgressMode::Allowlist));
    config.sandbox.image = image.clone();
    // No toolbox: the image's lack of a shell is then final.
    config.sandbox.toolbox_path = Some("/nonexistent/kiln-toolbox".into());
    // Sessions keep their sandbox between runs, as deployments do: the end
    // of the run does not sweep the session's network away by itself.
    config.sandbox_idle = Duration::from_secs(3600);
    app.start_worker(config).await;

    let spec = egress(EgressPolicy { mode: EgressMode::Allowlist, allow: None });
    let submitted = app.submit("alice", CreateRun { sandbox: spec, ..CreateRun::new("x") }).await;
    let events = app.events("alice", submitted.id).await;
    let network = kiln_worker::sandbox::docker::network::name(submitted.session_id);
    let left = docker.inspect_network(&network, None).await.is_ok();
    // What the test made goes before anything is asserted.
    drop(app);
    outside.stop().await;
    let _ = docker.remove_image(&image, Some(RemoveImageOptionsBuilder::new().force(true).build()), None).await;
    if left {
        let _ = docker.remove_network(&network).await;
    }

    // Refused after its network was made (the container was started).
    let error = pick!(&events, EventBody::RunFailed { error, .. } => error.clone()).next();
    assert!(error.as_deref().is_some_and(|e| e.contains("has no shell")), "{error:?}: {:?}", kinds(&events));
    assert!(!left, "{network} was left behind");
}

/// What a sandbox with egress can reach, read from inside it: a route to
/// its own session's subnet and no other (no default route), the proxy on
/// that subnet's gateway, and anything else the host listens on at the
/// gateway's address, such as the test's own listener here on 0.0.0.0.
/// That last one is what the worker closes when it manages the host's
/// firewall (the next test); with `KILN_EGRESS_HOST_FIREWALL=off` (or no
/// rights) it is open (docs/deployment.md, "What the sandbox reaches on the
/// host"): this test pins that reach, so a change to it (either way) is seen.
#[tokio::test]
async fn a_sandbox_reaches_its_gateway_and_nothing_beyond_its_subnet() {
    let outside = Outside::start().await;
    let host_service = tokio::net::TcpListener::bind(("0.0.0.0", 0)).await.unwrap();
    let port = host_service.local_addr().unwrap().port();
    let accept = tokio::spawn(async move { host_service.accept().await.map(|(_, peer)| peer.ip()) });
    let probe = r#"
import os, socket, struct
proxy = os.environ['HTTP_PROXY'].split('//')[1].split(':')
routes = []
for line in open('/proc/net/route').read().splitlines()[1:]:
    f = line.split()
    dest, mask = (socket.inet_ntoa(struct.pack('<I', int(x, 16))) for x in (f[1], f[7]))
    routes.append('%s/%s' % (dest, mask))
print('routes: ' + ' '.join(routes))
print('gateway: ' + proxy[0])
for name, port in [('proxy-port', int(proxy[1])), ('host-service', @PORT@)]:
    try:
        socket.create_connection((proxy[0], port), timeout=5).close(); print(name + ': ANSWERED')
    except Exception as e:
        print(name + ': ERR ' + type(e).__name__)
"#
    .replace("@PORT@", &port.to_string());
    let script = vec![Reply::tool("bash", bash_python(&probe)), Reply::text("done")];
    let app = TestApp::spawn(Options { worker: false, script, ..Default::default() }).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.sandbox.egress = Arc::new(EgressSettings {
        host_firewall: Arc::new(HostFirewall::new(FirewallSetting::Off)),
        ..settings(&outside, EgressMode::Allowlist)
    });
    // The session keeps its sandbox and network after the run, to be looked at.
    config.sandbox_idle = Duration::from_secs(3600);
    app.start_worker(config).await;
    let submitted = app
        .submit(
            "alice",
            CreateRun {
                sandbox: egress(EgressPolicy { mode: EgressMode::Allowlist, allow: None }),
                ..CreateRun::new("x")
            },
        )
        .await;
    let events = app.events("alice", submitted.id).await;
    let got = results(&events);

    // Its session's subnet, and a default route through the gateway: the
    // engine (20.10) gives one even on an `internal` network, whose rules
    // drop what would be forwarded; what is addressed to the host itself
    // is not forwarded, and is the host's firewall's to judge.
    // (gVisor lists the sandbox's own address as a host route too: inside
    // the subnet.)
    let gateway = u32::from(result(&got, "gateway").parse::<std::net::Ipv4Addr>().unwrap());
    let routes: Vec<(u32, u32)> = result(&got, "routes")
        .split(' ')
        .map(|route| {
            let (dest, mask) = route.split_once('/').unwrap();
            let parse = |a: &str| u32::from(a.parse::<std::net::Ipv4Addr>().unwrap());
            (parse(dest), parse(mask))
        })
        .collect();
    let default = routes.iter().filter(|(_, mask)| *mask == 0).count();
    let subnets: Vec<_> = routes.iter().filter(|(dest, mask)| *mask != 0 && gateway & mask == *dest).collect();
    assert_eq!((default, subnets.len()), (1, 1), "{got:?}");
    let (subnet, subnet_mask) = *subnets[0];
    for (dest, mask) in &routes {
        let inside = *mask >= subnet_mask && dest & subnet_mask == subnet;
        assert!(*mask == 0 || inside, "a route beyond the session's subnet: {got:?}");
    }
    assert_eq!(result(&got, "proxy-port"), "ANSWERED", "{got:?}");
    // The host's own listener on 0.0.0.0 answers at the gateway: the
    // documented reach the worker's (or the operator's) rules close.
    assert_eq!(result(&got, "host-service"), "ANSWERED", "{got:?}");
    let peer = tokio::time::timeout(Duration::from_secs(5), accept).await.unwrap().unwrap().unwrap();
    assert_ne!(peer, std::net::IpAddr::V4(gateway.into()), "the connection came from the sandbox, across its network");
    // It arrives on the host through the session network's bridge, named so
    // that the documented rule (`-i kiln+`: the proxy's port only) covers
    // it; the default route above goes through the same bridge.
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let network =
        docker.inspect_network(&kiln_worker::sandbox::docker::network::name(submitted.session_id), None).await;
    let bridge = network.unwrap().options.unwrap_or_default().get("com.docker.network.bridge.name").cloned();
    assert_eq!(bridge, Some(kiln_worker::sandbox::docker::network::bridge_name(submitted.session_id)));
    let address = std::fs::read_to_string(format!("/sys/class/net/{}/address", bridge.unwrap()));
    assert!(address.is_ok(), "the bridge is a host interface of that name");

    for container in app.containers_of(submitted.id).await {
        // As Kiln removes one: with its volumes and its loop disk.
        kiln_worker::sandbox::remove_by_id(&docker, &container).await;
    }
    docker.remove_network(&kiln_worker::sandbox::docker::network::name(submitted.session_id)).await.unwrap();

    drop(app);
    outside.stop().await;
}

/// Kiln's rules in the host firewall's chain for `bridge`, as `iptables -S` prints them.
fn host_rules_of(bridge: &str) -> Vec<String> {
    let out = std::process::Command::new("iptables").args(["-w", "10", "-S", CHAIN]).output().unwrap();
    // No chain yet: no rules.
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    listing.lines().filter(|l| l.split_whitespace().any(|w| w == bridge)).map(str::to_owned).collect()
}

/// Waits (generously) until `done` holds; whether it did.
async fn wait_until(mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

/// With the worker managing the host's firewall
/// (`KILN_EGRESS_HOST_FIREWALL`), what the previous test shows open is
/// closed: the sandbox reaches the proxy on its gateway and nothing else the
/// host listens on (the test's listener on 0.0.0.0 here). The rules are its
/// network's bridge's alone, and go with the network.
#[tokio::test]
async fn with_the_host_firewall_managed_a_sandbox_reaches_the_proxy_and_no_other_host_service() {
    let outside = Outside::start().await;
    let host_service = tokio::net::TcpListener::bind(("0.0.0.0", 0)).await.unwrap();
    let port = host_service.local_addr().unwrap().port();
    let accept = tokio::spawn(async move { host_service.accept().await.map(|(_, peer)| peer) });
    let probe = r#"
import os, socket, urllib.request
gateway = os.environ['HTTP_PROXY'].split('//')[1].split(':')[0]
try:
    socket.create_connection((gateway, @PORT@), timeout=5).close(); print('host-service: ANSWERED')
except Exception as e:
    print('host-service: ERR ' + type(e).__name__)
try:
    with urllib.request.urlopen('http://allowed.test:8080/plain', timeout=20) as r: print('through-proxy: OK ' + r.read().decode())
except Exception as e:
    print('through-proxy: ERR ' + type(e).__name__)
"#
    .replace("@PORT@", &port.to_string());
    let script = vec![Reply::tool("bash", bash_python(&probe)), Reply::text("done")];
    let app = TestApp::spawn(Options { worker: false, script, ..Default::default() }).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    // `on`: a worker that could not install the rules fails the run, so
    // the test cannot pass by the host being closed some other way.
    config.sandbox.egress = Arc::new(EgressSettings {
        host_firewall: Arc::new(HostFirewall::new(FirewallSetting::On)),
        ..settings(&outside, EgressMode::Allowlist)
    });
    app.start_worker(config).await;
    // Every call waits for approval: the session's sandbox and network
    // exist meanwhile, to be looked at.
    let spec = CreateRun {
        sandbox: egress(EgressPolicy { mode: EgressMode::Allowlist, allow: None }),
        approval: Some(ApprovalMode::Always),
        ..CreateRun::new("x")
    };
    let submitted = app.submit("alice", spec).await;
    let id = submitted.id;
    let waiting = app.events_until("alice", id, None, |e| e.kind() == "approval.requested").await;
    let call = pick!(&waiting, EventBody::ApprovalRequested { call_id, .. } => call_id.clone()).next();
    let call = call.unwrap_or_else(|| panic!("{:?}", kinds(&waiting)));

    // Two rules for this network's bridge: TCP to the proxy, then a drop of the rest.
    let bridge = kiln_worker::sandbox::docker::network::bridge_name(submitted.session_id);
    let rules = host_rules_of(&bridge);
    assert_eq!(rules.len(), 2, "{rules:?}");
    assert!(rules[0].contains("--dport 3128") && rules[0].ends_with("-j ACCEPT"), "{rules:?}");
    assert!(rules[1].ends_with("-j DROP"), "{rules:?}");
    // Named by the network's own id, which no later network of the session has.
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let network = kiln_worker::sandbox::docker::network::name(submitted.session_id);
    let network_id = docker.inspect_network(&network, None).await.unwrap().id.unwrap();
    assert!(rules.iter().all(|r| r.contains(&format!("kiln:{network_id}"))), "{rules:?}");

    let path = format!("/v1/runs/{id}/approvals/{call}");
    assert_eq!(app.post_json("alice", &path, json!({"decision": "approve"})).await.0, 200);
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let got = results(&events);
    assert!(result(&got, "host-service").starts_with("ERR"), "{got:?}");
    assert_eq!(result(&got, "through-proxy"), "OK outside says GET /plain", "{got:?}");
    assert!(!accept.is_finished(), "the host's listener was reached: {:?}", accept.await);

    // The session's sandbox goes with its run (no idle time): its network,
    // and then its rules, go too.
    let mut gone = false;
    for _ in 0..600 {
        if docker.inspect_network(&network, None).await.is_err() && host_rules_of(&bridge).is_empty() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "{network} or its rules are still there: {:?}", host_rules_of(&bridge));

    drop(app);
    outside.stop().await;
}

/// A worker that starts removes Kiln's rules of bridges that no longer
/// exist (a worker that died before removing its own), and no other.
#[tokio::test]
async fn a_starting_worker_sweeps_rules_of_bridges_that_are_gone() {
    let iptables =
        |args: &[&str]| std::process::Command::new("iptables").arg("-w").arg("10").args(args).status().unwrap();
    // The chain may be there already (other tests, a worker on this host).
    let _ = iptables(&["-N", CHAIN]);
    let stale = format!("kilnt{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let comment = format!("kiln:kiln-egress-{stale}");
    let rule = ["-i", stale.as_str(), "-m", "comment", "--comment", comment.as_str(), "-j", "DROP"];
    assert!(iptables(&[&["-A", CHAIN][..], &rule[..]].concat()).success());
    // Not Kiln's (no `kiln:` comment), on the same missing bridge: stays.
    let foreign = ["-i", stale.as_str(), "-j", "DROP"];
    assert!(iptables(&[&["-A", CHAIN][..], &foreign[..]].concat()).success());
    assert_eq!(host_rules_of(&stale).len(), 2);

    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.sandbox.egress = Arc::new(EgressSettings {
        host_firewall: Arc::new(HostFirewall::new(FirewallSetting::Auto)),
        ..Default::default()
    });
    app.start_worker(config).await;
    let swept = wait_until(|| host_rules_of(&stale).len() == 1).await;
    let left = host_rules_of(&stale);
    // The test's own rules go before anything is asserted.
    let removed_foreign = iptables(&[&["-D", CHAIN][..], &foreign[..]].concat()).success();
    if !swept {
        let _ = iptables(&[&["-D", CHAIN][..], &rule[..]].concat());
    }
    drop(app);
    assert!(swept, "the stale rule was not swept: {left:?}");
    assert!(!left[0].contains("kiln:"), "{left:?}");
    assert!(removed_foreign, "the rule that is not Kiln's was left alone");
}

/// The reaper removes a session's network, then its rules; a follow-up of
/// the same session, claimed meanwhile, makes the network again (same
/// name, same bridge) with fresh rules in between. Forced here step by
/// step: the old network's late rule removal leaves the successor's rules
/// in place, so its sandbox still reaches only the proxy.
#[tokio::test]
async fn removing_a_networks_rules_late_leaves_its_successors_rules_in_place() {
    use kiln_worker::sandbox::docker::network;
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    // `on`: rules that cannot be installed fail the test rather than pass it.
    let settings =
        EgressSettings { host_firewall: Arc::new(HostFirewall::new(FirewallSetting::On)), ..Default::default() };
    let session = uuid::Uuid::now_v7();
    let bridge = network::bridge_name(session);
    let old = network::ensure(&docker, &settings, session).await.unwrap();
    assert_eq!(host_rules_of(&bridge).len(), 2);

    // The reaper's first step: the old network goes.
    docker.remove_network(&old.id).await.unwrap();
    // The follow-up's network, same name and bridge, and its rules.
    let successor = network::ensure(&docker, &settings, session).await.unwrap();
    assert_eq!((successor.name.as_str(), successor.id == old.id), (old.name.as_str(), false));
    // The reaper's second step, late: the old network's rules.
    network::unprotect(&settings.host_firewall, &old).await;
    let left = host_rules_of(&bridge);

    network::remove(&docker, &settings.host_firewall, session).await;
    let after_removal = host_rules_of(&bridge);
    assert_eq!(left.len(), 2, "the successor lost its rules: {left:?}");
    assert!(left.iter().all(|r| r.contains(&format!("kiln:{}", successor.id))), "{left:?}");
    assert!(left[0].ends_with("-j ACCEPT") && left[1].ends_with("-j DROP"), "{left:?}");
    // Removing the successor takes its own rules.
    assert!(after_removal.is_empty(), "{after_removal:?}");
    assert!(docker.inspect_network(&successor.name, None).await.is_err());
}
