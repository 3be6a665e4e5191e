use super::*;
use serde_json::json;

#[test]
fn requests_are_flat_json_with_a_type_tag() {
    let req = Request { id: 7, body: RequestBody::View(ViewRequest::new("a.rs")) };
    let v = serde_json::to_value(&req).unwrap();
    assert_eq!(
        v,
        json!({"id": 7, "type": "view", "path": "a.rs", "offset": 1, "limit": 2000,
               "max_line_chars": 2000, "max_bytes": 102400})
    );
    assert_eq!(serde_json::from_value::<Request>(v).unwrap(), req);
}

#[test]
fn omitted_fields_take_defaults_and_unknown_fields_are_ignored() {
    let req: Request = serde_json::from_value(json!({"id": 1, "type": "exec", "command": "ls", "future": 1})).unwrap();
    assert_eq!(req, Request { id: 1, body: RequestBody::Exec(ExecRequest::new("ls")) });
    let ping: Request = serde_json::from_value(json!({"id": 2, "type": "ping"})).unwrap();
    assert_eq!(ping.body, RequestBody::Ping);
}

#[test]
fn responses_nest_the_reply_under_result() {
    let msg = ServerMessage::Response(Response {
        id: 3,
        result: Reply::Error(ToolError::new(ErrorKind::NotFound, "no such file: x")),
    });
    let v = serde_json::to_value(&msg).unwrap();
    assert_eq!(
        v,
        json!({"type": "response", "id": 3,
               "result": {"type": "error", "kind": "not_found", "message": "no such file: x"}})
    );
    assert_eq!(serde_json::from_value::<ServerMessage>(v).unwrap(), msg);
}

#[test]
fn unknown_error_kinds_from_a_newer_toolbox_still_parse() {
    let e: ToolError = serde_json::from_value(json!({"kind": "quota_exceeded", "message": "m"})).unwrap();
    assert_eq!(e.kind, ErrorKind::Other);
    assert!(!e.kind.is_model_fixable());
    assert!(ErrorKind::NotUnique.is_model_fixable());
}

#[test]
fn grep_render_separates_non_adjacent_groups() {
    let r = GrepResult {
        files: vec![GrepFile {
            path: "a.rs".into(),
            lines: vec![
                GrepLine { number: 1, text: "fn a()".into(), is_match: true },
                GrepLine { number: 2, text: "}".into(), is_match: false },
                GrepLine { number: 9, text: "fn b()".into(), is_match: true },
            ],
        }],
        total_matches: 3,
        omitted_matches: 1,
        files_with_matches: 1,
        binary_files_skipped: 0,
    };
    let text = r.render();
    assert!(text.starts_with("a.rs:1:fn a()\na.rs-2-}\n--\na.rs:9:fn b()\n"), "{text}");
    assert!(text.contains("1 more matching lines"));
}
