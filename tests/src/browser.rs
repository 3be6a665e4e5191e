//! A real headless Chromium for the web view's tests, driven over
//! WebDriver (Debian's `chromium` and `chromium-driver`; `scripts/test`
//! installs them).
//!
//! [`Browser::start`] returns `None`, after saying so loudly, only when
//! Chromium is genuinely missing and `KILN_REQUIRE_BROWSER` is unset;
//! `.ci/run` sets it, so CI never skips.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

const CHROMEDRIVER: &str = "chromedriver";
const CHROMIUM_CANDIDATES: [&str; 3] = ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"];

pub struct Browser {
    pub client: Client,
    /// chromedriver; killed on drop (it takes its Chromium with it).
    _driver: Child,
}

fn required() -> bool {
    std::env::var_os("KILN_REQUIRE_BROWSER").is_some_and(|v| !v.is_empty() && v != "0")
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
}

impl Browser {
    /// Starts chromedriver and a headless Chromium with a `width`×`height`
    /// window.
    pub async fn start(test: &str, width: u32, height: u32) -> Option<Browser> {
        Self::start_with(test, width, height, None).await
    }

    /// [`Browser::start`], saving what the page downloads in `downloads`
    /// without asking.
    pub async fn start_downloading(test: &str, width: u32, height: u32, downloads: &Path) -> Option<Browser> {
        Self::start_with(test, width, height, Some(downloads)).await
    }

    async fn start_with(test: &str, width: u32, height: u32, downloads: Option<&Path>) -> Option<Browser> {
        let driver_path = on_path(CHROMEDRIVER);
        let chromium = CHROMIUM_CANDIDATES.iter().map(Path::new).find(|p| p.is_file());
        let (Some(driver_path), Some(chromium)) = (driver_path, chromium) else {
            assert!(
                !required(),
                "KILN_REQUIRE_BROWSER is set but chromium / chromedriver are missing \
                 (apt-get install -y chromium chromium-driver; scripts/test does this as root)"
            );
            eprintln!(
                "\n!!!!!!!!\nSKIPPED {test}: no headless Chromium here (apt-get install -y chromium \
                 chromium-driver, which scripts/test does as root). Set KILN_REQUIRE_BROWSER=1 to \
                 make this a failure.\n!!!!!!!!\n"
            );
            return None;
        };
        let port = free_port();
        let driver = Command::new(driver_path)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        wait_until_listening(port).await;
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new",
                    // Tests run as root, where Chromium's sandbox cannot start.
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-proxy-server",
                    "--no-first-run",
                    "--disable-extensions",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--metrics-recording-only",
                    format!("--window-size={width},{height}"),
                ],
            },
        });
        let mut capabilities = capabilities;
        if let Some(dir) = downloads {
            capabilities["goog:chromeOptions"]["prefs"] =
                json!({ "download.default_directory": dir, "download.prompt_for_download": false });
        }
        let Value::Object(capabilities) = capabilities else { unreachable!() };
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&url)
            .await
            .expect("open a Chromium session through chromedriver");
        Some(Browser { client, _driver: driver })
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page.
    pub async fn js(&self, script: &str, args: Vec<Value>) -> Value {
        self.client.execute(script, args).await.expect("execute script")
    }

    /// Clicks the element `css` finds. A list the page re-renders (after a
    /// save, or when it reloads) replaces its rows, so an element found a
    /// moment before the click may be gone by then (WebDriver's stale
    /// element reference): it is found again and clicked, for up to 10 s.
    pub async fn click(&self, css: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let element = self.client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("finding {css}: {e}"));
            match element.click().await {
                Ok(()) => return,
                Err(e) if e.is_stale_element_reference() && Instant::now() < deadline => continue,
                Err(e) => panic!("clicking {css}: {e}"),
            }
        }
    }

    /// Polls `script` until it returns something truthy, or panics with
    /// `what` after `timeout`.
    pub async fn wait_js(&self, what: &str, timeout: Duration, script: &str, args: Vec<Value>) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.js(script, args.clone()).await;
            let truthy = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Opens the web view at `site` and signs in as `sub` by pasting a
    /// token, as a person does; returns once the runs list shows.
    pub async fn sign_in(&self, site: &str, sub: &str) {
        const WAIT: Duration = Duration::from_secs(60);
        self.client.goto(&format!("{site}/")).await.expect("open the web view");
        let field = self
            .client
            .wait()
            .at_most(WAIT)
            .for_element(fantoccini::Locator::Css("#signin-token"))
            .await
            .expect("the sign-in form");
        field.send_keys(&crate::token(sub)).await.expect("type the token");
        let submit = self.client.find(fantoccini::Locator::Css("#signin-form button[type=submit]")).await;
        submit.expect("the sign-in button").click().await.expect("click sign in");
        self.wait_js("the runs list", WAIT, "return !document.getElementById('view-runs').hidden;", vec![]).await;
    }

    /// Saves a PNG screenshot of the window.
    pub async fn screenshot(&self, path: &Path) {
        let png = self.client.screenshot().await.expect("screenshot");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("artifact directory");
        }
        std::fs::write(path, png).expect("write screenshot");
    }
}

/// `target/artifacts/NAME`: where tests leave files for people to look at.
pub fn artifact(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"), PathBuf::from);
    target.join("artifacts").join(name)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind a free port").local_addr().expect("local addr").port()
}

async fn wait_until_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not start listening on {port}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
