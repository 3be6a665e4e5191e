//! Framing and request errors never crash the toolbox or desync the stream.

mod common;

use common::*;
use kiln_toolbox::protocol::*;
use serde_json::json;

fn expect_protocol_error(tb: &mut Toolbox) -> String {
    match tb.next_matching(|m| matches!(m, ServerMessage::ProtocolError(_))) {
        ServerMessage::ProtocolError(e) => e.message,
        _ => unreachable!(),
    }
}

#[test]
fn bad_frames_get_error_replies_and_the_stream_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = Toolbox::start(dir.path());

    // Not JSON.
    tb.write_raw(&kiln_toolbox::framing::encode_frame(b"\xff\x00garbage").unwrap());
    assert!(expect_protocol_error(&mut tb).contains("not JSON"));

    // JSON without an id.
    tb.send_json(json!({"type": "ping"}));
    assert!(expect_protocol_error(&mut tb).contains("id"));

    // An unknown request type (a newer worker) and a malformed known one.
    tb.send_json(json!({"id": 900, "type": "teleport"}));
    let e = match tb.wait(900) {
        Reply::Error(e) => e,
        other => panic!("{other:?}"),
    };
    assert_eq!(e.kind, ErrorKind::Unsupported);
    tb.send_json(json!({"id": 901, "type": "view"}));
    match tb.wait(901) {
        Reply::Error(e) => assert_eq!(e.kind, ErrorKind::InvalidRequest),
        other => panic!("{other:?}"),
    }

    // An oversize frame is skipped whole, without being buffered.
    let len = MAX_FRAME_BYTES + 1;
    let mut frame = (len as u32).to_be_bytes().to_vec();
    frame.resize(4 + len, b'{');
    tb.write_raw(&frame);
    assert!(expect_protocol_error(&mut tb).contains("exceeds the maximum"));

    assert_eq!(tb.call(RequestBody::Ping), Reply::Pong);
    assert!(status_kib(tb.pid(), "VmHWM:") < 32 * 1024);
    assert!(tb.close().success());
}
