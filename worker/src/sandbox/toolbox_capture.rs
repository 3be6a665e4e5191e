//! The change capture over the toolbox's connection
//! (`kiln_toolbox::change_capture::call`) instead of an exec through the
//! engine: the capture's stdout comes as base64 chunks, decoded and bounded
//! here (the toolbox is the sandbox talking).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use kiln_toolbox::protocol::{CaptureRequest, CaptureResult, Reply, RequestBody};

use super::Sandbox;
use super::exec::RawOutput;
use super::toolbox::{OutputSink, ToolboxError};

/// Most of the capture's stderr kept: it becomes an error message.
const STDERR_KEPT: usize = 4096;
/// What `timeout` exits with: how the caller tells a capture that ran out
/// of time, whichever way it ran.
const TIMED_OUT_STATUS: i64 = 124;

/// The capture's stdout as the sink received it.
#[derive(Debug, Default)]
struct Received {
    bytes: Vec<u8>,
    /// More than the cap came; the rest was not kept.
    overflow: bool,
    /// A chunk was not base64: the toolbox broke the protocol.
    garbled: bool,
}

impl Sandbox {
    /// Runs the worker's toolbox's `capture` subcommand with `args` through
    /// the sandbox's toolbox, keeping up to `stdout_cap` bytes of its
    /// stdout. `Ok(None)`: not here (no toolbox connection, or one that
    /// does not take the request or failed to run it); the caller then
    /// runs the subcommand by an exec.
    pub(crate) async fn capture_by_toolbox(
        &self,
        args: &[&str],
        stdout_cap: usize,
        timeout: Duration,
    ) -> Result<Option<RawOutput>, ToolboxError> {
        let received = Arc::new(Mutex::new(Received::default()));
        let request = CaptureRequest {
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            max_bytes: stdout_cap as u64,
        };
        let sink = decoding_sink(received.clone(), stdout_cap);
        let result = match self.toolbox_call(RequestBody::Capture(request), Some(sink)).await? {
            Some(Reply::Capture(result)) => result,
            None => return Ok(None),
            Some(Reply::Error(e)) => {
                tracing::debug!(container = %self.id, error = %e.message, "the toolbox did not take the capture");
                return Ok(None);
            }
            Some(other) => return Err(ToolboxError::Unexpected(format!("{other:?} for a capture"))),
        };
        let received = std::mem::take(&mut *lock(&received));
        raw_output(received, result).map(Some)
    }
}

/// The capture's result as an exec's would be.
fn raw_output(received: Received, result: CaptureResult) -> Result<RawOutput, ToolboxError> {
    if received.garbled {
        return Err(ToolboxError::Misbehaved("the sandbox's tool process sent a capture that is not base64".into()));
    }
    let mut stderr = result.stderr;
    if stderr.len() > STDERR_KEPT {
        let mut cut = STDERR_KEPT;
        while !stderr.is_char_boundary(cut) {
            cut -= 1;
        }
        stderr.truncate(cut);
    }
    let exit_code = match result.timed_out {
        true => Some(TIMED_OUT_STATUS),
        false => result.exit_code.map(i64::from),
    };
    Ok(RawOutput { exit_code, stdout: received.bytes, overflow: received.overflow || result.overflow, stderr })
}

/// A sink that decodes each chunk into `received`, up to `cap` bytes.
fn decoding_sink(received: Arc<Mutex<Received>>, cap: usize) -> OutputSink {
    Arc::new(move |chunk: String| {
        let mut received = lock(&received);
        if received.overflow || received.garbled {
            return false;
        }
        let Ok(bytes) = STANDARD.decode(chunk.as_bytes()) else {
            received.garbled = true;
            return false;
        };
        if received.bytes.len().saturating_add(bytes.len()) > cap {
            received.overflow = true;
            return false;
        }
        received.bytes.extend_from_slice(&bytes);
        true
    })
}

fn lock(received: &Mutex<Received>) -> MutexGuard<'_, Received> {
    // Appends only: a panic cannot leave it half-changed.
    received.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(chunks: &[&str], cap: usize) -> Received {
        let received = Arc::new(Mutex::new(Received::default()));
        let sink = decoding_sink(received.clone(), cap);
        for chunk in chunks {
            sink((*chunk).to_owned());
        }
        std::mem::take(&mut *lock(&received))
    }

    fn ended(code: Option<i32>) -> CaptureResult {
        CaptureResult { exit_code: code, timed_out: false, overflow: false, stderr: String::new() }
    }

    #[test]
    fn chunks_are_decoded_in_order_within_the_cap() {
        let chunks = [STANDARD.encode(b"abc\0"), STANDARD.encode([0xff, b'\n'])];
        let got = decode(&[&chunks[0], &chunks[1]], 6);
        assert_eq!(got.bytes, b"abc\0\xff\n");
        assert!(!got.overflow && !got.garbled);
    }

    #[test]
    fn output_past_the_cap_is_not_kept_and_says_so() {
        let chunk = STANDARD.encode([b'x'; 4]);
        let got = decode(&[&chunk, &chunk], 6);
        assert_eq!(got.bytes, b"xxxx", "the chunk that would pass the cap is dropped whole");
        assert!(got.overflow);
        let out = raw_output(got, ended(Some(0))).expect("an output");
        assert!(out.overflow, "the caller refuses it");
    }

    #[test]
    fn a_chunk_that_is_not_base64_fails_the_capture() {
        let got = decode(&["not base64!"], 100);
        assert!(got.garbled);
        assert!(matches!(raw_output(got, ended(Some(0))), Err(ToolboxError::Misbehaved(_))));
    }

    #[test]
    fn the_toolboxs_own_overflow_and_timeout_are_taken_and_stderr_is_cut() {
        let result = CaptureResult { exit_code: None, timed_out: true, overflow: true, stderr: "é".repeat(4000) };
        let out = raw_output(Received::default(), result).expect("an output");
        assert_eq!(out.exit_code, Some(TIMED_OUT_STATUS));
        assert!(out.overflow);
        assert!(out.stderr.len() <= STDERR_KEPT && out.stderr.starts_with('é'));
    }
}
