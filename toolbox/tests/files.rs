//! File tools through the real binary: view paging over a large file with
//! the cached line index, binary and invalid UTF-8 files, edit errors, and
//! search honouring `.gitignore`.

mod common;

use std::fmt::Write as _;
use std::fs;

use common::*;
use kiln_toolbox::protocol::*;

#[test]
fn view_pages_through_a_large_file_without_rescanning() {
    let dir = tempfile::tempdir().unwrap();
    let lines = 400_000u64;
    let mut content = String::new();
    for i in 1..=lines {
        let _ = writeln!(content, "line {i} {}", "x".repeat((i % 17) as usize));
    }
    fs::write(dir.path().join("big.txt"), &content).unwrap();
    let size = content.len() as u64;
    assert!(size > 5_000_000);
    let mut tb = Toolbox::start(dir.path());

    // A page near the start: read as far as the page, and the header
    // states only what is known.
    let mut req = ViewRequest::new("big.txt");
    req.offset = 1000;
    req.limit = 100;
    let first = tb.view(req.clone());
    assert!(!first.total_known);
    assert_eq!(first.total_lines, 1100, "the lines read, and the one after them");
    assert!(
        first
            .text
            .starts_with(&format!("{}: {size} bytes (7.9 MiB), at least 1100 lines (not yet counted", first.path)),
        "{}",
        &first.text[..200]
    );
    assert!(first.text.contains("1000\tline 1000 "));
    assert!(
        first.text.ends_with("[showing lines 1000-1099 of at least 1100; to read more, call view with offset=1100]\n")
    );
    assert!(first.bytes_scanned < 20_000, "{}", first.bytes_scanned);

    // The rest is counted in the background; each view stops the count and
    // starts it again from where it was, so polling does not hold it back.
    req.offset = 250_000;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let counted = loop {
        let v = tb.view(req.clone());
        if v.total_known {
            break v;
        }
        assert!(v.total_lines < lines, "{}", v.total_lines);
        assert!(std::time::Instant::now() < deadline, "the count did not finish");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(counted.total_lines, lines);
    assert!(counted.text.starts_with(&format!("{}: {lines} lines, {size} bytes (7.9 MiB)\n", counted.path)));
    assert!(
        counted.text.contains(&format!("250000\tline 250000 {}\n", "x".repeat(250_000 % 17))),
        "{}",
        &counted.text[..200]
    );
    assert!(counted.text.contains("250099\tline 250099"));
    assert!(!counted.text.contains("250100\t"));
    assert!(
        counted.text.ends_with("[showing lines 250000-250099 of 400000; to read more, call view with offset=250100]\n")
    );
    assert_eq!((counted.first_line, counted.last_line, counted.next_offset), (250_000, 250_099, Some(250_100)));

    // The next page starts exactly where the last ended.
    req.offset = 250_100;
    let second = tb.view(req.clone());
    assert!(second.text.contains("250100\tline 250100"));
    assert_eq!(second.bytes_scanned, 0);

    // Any other line is found from the nearest checkpoint, not from the start.
    req.offset = 399_999;
    let far = tb.view(req.clone());
    assert!(far.text.contains("399999\tline 399999"));
    assert!(far.text.contains("400000\tline 400000"));
    assert_eq!(far.next_offset, None);
    assert!(far.bytes_scanned < 200_000, "{}", far.bytes_scanned);

    // A changed file is indexed afresh.
    fs::write(dir.path().join("big.txt"), "just\ntwo\n").unwrap();
    req.offset = 2;
    let changed = tb.view(req);
    assert_eq!((changed.total_lines, changed.last_line), (2, 2));
    assert!(changed.text.contains("     2\ttwo\n"));
}

#[test]
fn binary_images_and_invalid_utf8_are_described_not_dumped() {
    let dir = tempfile::tempdir().unwrap();
    let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    png.extend(32u32.to_be_bytes());
    png.extend(16u32.to_be_bytes());
    png.extend([0u8; 100]);
    fs::write(dir.path().join("pic.png"), &png).unwrap();
    fs::write(dir.path().join("photo.jpg"), b"\xff\xd8\xff\xe0\0\x10JFIF").unwrap();
    fs::write(dir.path().join("data.bin"), b"abc\0\x01\x02").unwrap();
    fs::write(dir.path().join("latin1.txt"), b"caf\xe9\nok\n").unwrap();
    let mut tb = Toolbox::start(dir.path());

    let v = tb.view(ViewRequest::new("pic.png"));
    let info = v.binary.unwrap();
    assert_eq!(
        (info.kind.as_str(), info.mime.as_deref(), info.width, info.height),
        ("png", Some("image/png"), Some(32), Some(16))
    );
    assert!(v.text.ends_with("pic.png: PNG image, 32x16, 124 bytes; binary content is not shown\n"), "{}", v.text);
    assert_eq!(tb.view(ViewRequest::new("photo.jpg")).binary.unwrap().kind, "jpeg");
    let v = tb.view(ViewRequest::new("data.bin"));
    assert!(v.text.contains("binary file, 6 bytes"), "{}", v.text);

    let v = tb.view(ViewRequest::new("latin1.txt"));
    assert!(v.lossy);
    assert!(v.text.contains("(invalid UTF-8 shown as \u{FFFD})"));
    assert!(v.text.contains("     1\tcaf\u{FFFD}\n     2\tok\n"));

    assert_eq!(tb.error(RequestBody::View(ViewRequest::new("missing.txt"))).kind, ErrorKind::NotFound);
    assert_eq!(tb.error(RequestBody::View(ViewRequest::new("."))).kind, ErrorKind::IsDirectory);
}

#[test]
fn edit_explains_why_it_did_not_apply() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("lib.rs"), "fn a() {\n    let x = 1;\n}\n\nfn b() {\n    let x = 1;\n}\n").unwrap();
    let mut tb = Toolbox::start(dir.path());
    let edit = |old: &str, new: &str| {
        RequestBody::Edit(EditRequest {
            path: "lib.rs".into(),
            old_string: old.into(),
            new_string: new.into(),
            replace_all: false,
            expected: None,
        })
    };

    let e = tb.error(edit("    let x = 1;", "    let x = 2;"));
    assert_eq!(e.kind, ErrorKind::NotUnique);
    assert!(e.message.contains("occurs 2 times") && e.message.contains("lines 2, 6"), "{}", e.message);

    let e = tb.error(edit("fn c() {\n    let y = 1;", "x"));
    assert_eq!(e.kind, ErrorKind::NoMatch);
    assert!(e.message.contains("closest lines"), "{}", e.message);
    assert!(e.message.contains("     1\tfn a() {\n     2\t    let x = 1;\n"), "{}", e.message);

    // View, then edit against the viewed version; a stale version is refused.
    let v = tb.view(ViewRequest::new("lib.rs"));
    let Reply::Edit(r) = tb.call(RequestBody::Edit(EditRequest {
        path: "lib.rs".into(),
        old_string: "fn b() {\n    let x = 1;".into(),
        new_string: "fn b() {\n    let x = 3;".into(),
        replace_all: false,
        expected: Some(v.version),
    })) else {
        panic!("edit failed")
    };
    assert!(r.diff.contains("-    let x = 1;\n+    let x = 3;\n"), "{}", r.diff);
    let Reply::Stat(s) = tb.call(RequestBody::Stat(StatRequest { path: "lib.rs".into() })) else { panic!() };
    assert_eq!((s.kind, s.version()), (FileKind::File, r.version));
    let e = tb.error(RequestBody::Write(WriteRequest {
        path: "lib.rs".into(),
        content: "overwrite".into(),
        expected: Some(v.version),
    }));
    assert_eq!(e.kind, ErrorKind::Conflict);
}

#[test]
fn grep_glob_and_ls_honour_gitignore_and_skip_git() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    for d in ["src", ".git/objects", "target/debug", "node_modules/x"] {
        fs::create_dir_all(p.join(d)).unwrap();
    }
    fs::write(p.join(".gitignore"), "/target\nnode_modules/\n").unwrap();
    fs::write(p.join("src/main.rs"), "fn main() {\n    let needle = 1;\n}\n").unwrap();
    fs::write(p.join("README.md"), "Find the Needle.\n").unwrap();
    fs::write(p.join("target/debug/gen.rs"), "needle\n").unwrap();
    fs::write(p.join("node_modules/x/i.rs"), "needle\n").unwrap();
    fs::write(p.join(".git/objects/n.rs"), "needle\n").unwrap();
    let mut tb = Toolbox::start(p);

    let Reply::Glob(g) =
        tb.call(RequestBody::Glob(GlobRequest { pattern: "**/*.rs".into(), path: None, max_results: 50 }))
    else {
        panic!()
    };
    assert_eq!(g.paths, ["src/main.rs"]);

    let grep = GrepRequest {
        pattern: "needle".into(),
        path: None,
        include: None,
        literal: false,
        case_insensitive: true,
        context: 0,
        max_results: 50,
    };
    let Reply::Grep(r) = tb.call(RequestBody::Grep(grep.clone())) else { panic!() };
    assert_eq!(r.render(), "README.md:1:Find the Needle.\nsrc/main.rs:2:    let needle = 1;\n");
    let Reply::Grep(r) = tb.call(RequestBody::Grep(GrepRequest { include: Some("*.md".into()), ..grep })) else {
        panic!()
    };
    assert_eq!(r.total_matches, 1);

    let Reply::Ls(l) = tb.call(RequestBody::Ls(LsRequest { path: ".".into(), max_entries: 100 })) else { panic!() };
    let names: Vec<&str> = l.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, [".git", ".gitignore", "README.md", "node_modules", "src", "target"], "ls lists everything");
}
