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

    // First page: header, first line, bounded, told how to go on. Only the
    // page was read, so the header states the size and a lower bound.
    let first = &out[1].0;
    assert!(first.contains(": 1100000000 bytes (1.0 GiB), at least "), "{}", &first[..200]);
    assert!(!first.contains("11000000 lines"), "{}", &first[..200]);
    assert!(first.contains("line 0000000001 "));
    assert!(first.len() < 300_000, "a page is bounded: {} bytes", first.len());
    assert!(first.contains("to read more, call view with offset="));

    // Near the end: the last lines, and no "read more"; reading there
    // counted every line.
    let end = &out[2].0;
    assert!(end.contains("11000000 lines, 1100000000 bytes (1.0 GiB)"), "{}", &end[..200]);
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

/// 10,000,000 lines of exactly 100 bytes: 1.0 GB.
const LINES: u64 = 10_000_000;
const GENERATE_1GB: &str = "pad=$(printf '%083d' 0); seq -f \"line %010.0f $pad\" 1 10000000 > big.txt \
    && stat -c %s big.txt";

/// Bytes the toolbox process has read (`rchar`: every read, from the page
/// cache or not), less what its background line counter's thread has read.
/// Read from the host's `/proc` (the tests run as root beside the engine):
/// inside the container even root may not read a process that is not
/// dumpable. The counter is read first: if it reads between the two, the
/// figure errs high.
async fn toolbox_reads(docker: &bollard::Docker, container: &str) -> u64 {
    let top = docker.top_processes(container, None).await.unwrap();
    let titles = top.titles.unwrap_or_default();
    let pid_col = titles.iter().position(|t| t == "PID").unwrap();
    let cmd_col = titles.iter().position(|t| t == "CMD" || t == "COMMAND").unwrap();
    let processes = top.processes.unwrap_or_default();
    let toolbox = processes.iter().find(|p| p[cmd_col].contains("kiln-toolbox")).expect("the toolbox process");
    let pid = &toolbox[pid_col];
    let rchar = |io: &str| -> u64 {
        let text = std::fs::read_to_string(io).unwrap_or_else(|e| panic!("{io}: {e} (the test reads it as root)"));
        text.lines().find_map(|l| l.strip_prefix("rchar: ")).unwrap().trim().parse().unwrap()
    };
    let mut counter = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if comm.trim() == kiln_toolbox::line_count::THREAD_NAME {
            counter = rchar(&task.join("io").to_string_lossy());
        }
    }
    rchar(&format!("/proc/{pid}/io")) - counter
}

async fn view_page(sandbox: &kiln_worker::sandbox::Sandbox, offset: u64) -> kiln_toolbox::protocol::ViewResult {
    use kiln_toolbox::protocol::{Reply, RequestBody, ViewRequest};
    // As the view tool asks: 2000 lines, within 100 KiB.
    let request = ViewRequest { offset, ..ViewRequest::new("big.txt") };
    match sandbox.toolbox_call(RequestBody::View(request), None).await.unwrap() {
        Some(Reply::View(v)) => v,
        other => panic!("view at {offset}: {other:?}"),
    }
}

/// The header and the continuation line claim an exact total only when it
/// is known, and then it is the file's.
fn assert_honest(v: &kiln_toolbox::protocol::ViewResult) {
    let header = v.text.lines().next().unwrap();
    if v.total_known {
        assert_eq!(v.total_lines, LINES, "{header}");
        assert!(header.ends_with(&format!("{LINES} lines, {} bytes (953.7 MiB)", LINES * 100)), "{header}");
    } else {
        assert!(v.total_lines < LINES, "{header}");
        assert!(header.contains(&format!("at least {} lines (not yet counted", v.total_lines)), "{header}");
        assert!(!v.text.contains(&format!("{LINES} lines")) && !v.text.contains(&format!(" of {LINES}")), "{header}");
    }
}

#[tokio::test]
async fn the_first_page_of_a_gigabyte_reads_only_as_far_as_the_page_and_the_count_follows() {
    use kiln_toolbox::protocol::{ExecRequest, Reply, RequestBody};
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let mut config =
        kiln_tests::worker_config(kiln_worker::ProviderKind::OpenAi, std::time::Duration::from_secs(10)).sandbox;
    config.disk_mb = 2048;
    let owner = kiln_worker::sandbox::Owner {
        run_id: uuid::Uuid::new_v4(),
        session_id: uuid::Uuid::new_v4(),
        worker: format!("test-{}", uuid::Uuid::new_v4().simple()),
    };
    let sandbox = kiln_worker::sandbox::Sandbox::start(&docker, &config, &owner).await.unwrap();
    let generate = ExecRequest { timeout_ms: 600_000, ..ExecRequest::new(GENERATE_1GB) };
    let generated = sandbox.toolbox_call(RequestBody::Exec(generate), None).await;
    let size = match generated {
        Ok(Some(Reply::Exec(r))) if r.exit_code == Some(0) => r.output.trim().to_owned(),
        other => {
            sandbox.remove().await;
            panic!("generating the file: {other:?}");
        }
    };
    let result = async {
        assert_eq!(size, (LINES * 100).to_string());

        // A page near the start.
        let before = toolbox_reads(&docker, sandbox.id()).await;
        let first = view_page(&sandbox, 1000).await;
        let read = toolbox_reads(&docker, sandbox.id()).await - before;
        assert!(first.text.contains("  1000\tline 0000001000 "), "{}", &first.text[..300]);
        assert_eq!(first.next_offset, Some(first.last_line + 1));
        assert!(!first.total_known, "{}", &first.text[..300]);
        assert_honest(&first);
        // The page is 100 KiB; the file 1 GB. Reads run ahead of the page by
        // a buffer or two, not by the rest of the file.
        eprintln!("the toolbox read {read} bytes for the page at line 1000");
        assert!(read < 4 * 1024 * 1024, "the toolbox read {read} bytes for a page near the start");

        // The count finishes in the background; every answer meanwhile is
        // honest, and the next page is where the last one ended.
        let started = std::time::Instant::now();
        let deadline = started + std::time::Duration::from_secs(300);
        let counted = loop {
            let v = view_page(&sandbox, first.last_line + 1).await;
            assert_eq!(v.first_line, first.last_line + 1);
            assert_eq!(v.bytes_scanned, 0, "the next page starts where the last ended");
            assert_honest(&v);
            if v.total_known {
                break v;
            }
            assert!(std::time::Instant::now() < deadline, "the count did not finish: {}", v.total_lines);
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        };
        eprintln!("counted in the background within {:?}", started.elapsed());
        assert!(
            counted.text.contains(&format!("of {LINES}; to read more")),
            "{}",
            counted.text.lines().last().unwrap()
        );
    };
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(result)).await;
    sandbox.remove().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
