//! `view` through a real session on files models choke on: a 1.1 GB text
//! file (first page, a page near the end, the page after a page), a 100 KB
//! single line, a binary image, invalid UTF-8.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kiln_protocol::{CreateRun, EventBody, RunStatus};
use kiln_scripted_model::{Reply, ScriptedCall};
use kiln_tests::{Options, TestApp, kinds, outcome, pick};
use serde_json::json;

/// 11,000,000 lines of exactly 100 bytes: 1.1 GB.
const GENERATE: &str = "pad=$(printf '%083d' 0); seq -f \"line %010.0f $pad\" 1 11000000 > big.txt \
    && head -c 100000 /dev/zero | tr '\\0' a > long.txt && echo >> long.txt \
    && printf '\\x89PNG\\r\\n\\x1a\\n\\0\\0\\0\\rIHDR\\0\\0\\0\\x10\\0\\0\\0\\x08' > img.png \
    && head -c 2000 /dev/urandom >> img.png \
    && printf 'caf\\xc3\\xa9 ok\\nbad \\xff\\xfe byte\\n' > latin.txt && stat -c '%s %n' big.txt long.txt";

fn view(path: &str, offset: Option<u64>) -> ScriptedCall {
    match offset {
        Some(o) => ScriptedCall::new("view", json!({"path": path, "offset": o})),
        None => ScriptedCall::new("view", json!({"path": path})),
    }
}

#[tokio::test]
async fn view_pages_through_a_gigabyte_and_describes_what_it_cannot_show() {
    let app = TestApp::spawn(Options {
        script: vec![
            Reply::tool("bash", json!({"command": GENERATE, "timeout_s": 600})),
            Reply::tools(vec![
                view("big.txt", None),
                view("big.txt", Some(10_999_990)),
                view("long.txt", None),
                view("img.png", None),
                view("latin.txt", None),
            ]),
            Reply::tool("view", json!({"file_path": "big.txt", "offset": 5_000_000})),
            Reply::text("done"),
        ],
        worker: false,
        ..Default::default()
    })
    .await;
    // The files take 1.1 GB: more than a session's default disk bound.
    let mut config = kiln_tests::worker_config(kiln_worker::ProviderKind::OpenAi, std::time::Duration::from_secs(10));
    config.sandbox.disk_mb = 2048;
    app.start_worker(config).await;
    let id = app.submit("alice", CreateRun::new("read big files")).await.id;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let out: Vec<(String, bool)> =
        pick!(events, EventBody::ToolResult { output, is_error, .. } => (output.clone(), *is_error)).collect();
    assert_eq!(out.len(), 7, "{out:?}");
    assert!(!out[0].1 && out[0].0.contains("1100000000 big.txt"), "{:?}", out[0]);
    assert!(out.iter().all(|(_, is_error)| !is_error), "{out:?}");

    // First page: header, first line, bounded, told how to go on.
    let first = &out[1].0;
    assert!(first.contains("11000000 lines, 1100000000 bytes"), "{}", &first[..200]);
    assert!(first.contains("line 0000000001 "));
    assert!(first.len() < 300_000, "a page is bounded: {} bytes", first.len());
    assert!(first.contains("to read more, call view with offset="));

    // Near the end: the last lines, and no "read more".
    let end = &out[2].0;
    assert!(end.contains("line 0010999990 ") && end.contains("line 0011000000 "), "{end}");
    assert!(!end.contains("to read more"), "{end}");

    // A 100 KB line is cut with a marker.
    let long = &out[3].0;
    assert!(long.contains("line truncated at 2000 characters; 100001 bytes in all"), "{}", &long[..300]);
    assert!(long.len() < 5_000);

    // Binary: described, not dumped.
    let img = &out[4].0;
    assert!(img.contains("PNG image") && img.contains("16x8") && img.contains("binary content is not shown"), "{img}");

    // Invalid UTF-8: shown lossily, with a note.
    let latin = &out[5].0;
    assert!(latin.contains("invalid UTF-8 shown as \u{FFFD}") && latin.contains("café ok"), "{latin}");
    assert!(latin.contains("bad \u{FFFD}\u{FFFD} byte"), "{latin}");

    // The middle of the file, by `file_path`: the exact lines.
    let middle = &out[6].0;
    assert!(middle.contains("5000000\tline 0005000000 "), "{}", &middle[..300]);
}
