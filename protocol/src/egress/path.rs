//! A request's path in the one form `path_prefixes` are matched against.
//!
//! Origins normalise a path before they route it: `/simple/../admin` and
//! `/simple/%2e%2e/admin` are `/admin` to most of them. A prefix matched
//! against the raw path would let both through a `/simple/` rule, so the
//! path is normalised first, as RFC 3986 §6.2.2 has it:
//! - percent-encodings of unreserved characters (letters, digits, `-`,
//!   `_`, `~`) are decoded (`/%73imple/` is `/simple/`); every other
//!   encoding stays encoded, its hex digits upper-cased;
//! - dot segments are removed (§5.2.4 `remove_dot_segments`).
//!
//! What servers do *not* agree on is refused rather than guessed at:
//! an encoded `/`, `\` or `.` (decoded before or after the dot segments
//! are removed, or not at all, depending on the server), an encoded `%`
//! (double encoding: `%252e` is `%2e` to a server that decodes twice),
//! an encoded control character (`%00` ends the path in C), a raw `\`
//! (a separator on some servers), a malformed encoding, and a dot segment
//! carrying a path parameter (`..;x/`, which Java servers take for `..`).
//!
//! Pure, and no refusal quotes the path: a path is hostile input and may
//! carry a secret.

/// Why a path cannot be judged by path rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathRefusal {
    #[error("the path does not start with /")]
    NotAbsolute,
    #[error("the path holds a {0} (servers differ on what it means)")]
    RawCharacter(&'static str),
    #[error("a malformed percent-encoding")]
    Malformed,
    #[error("an encoded {0} ({1}): servers differ on decoding it")]
    Encoded(&'static str, &'static str),
    #[error("a dot segment with a path parameter (.;, ..;)")]
    DotSegmentParameter,
}

/// `raw` normalised (see the module's comment), or why it is refused.
pub fn normalize(raw: &str) -> Result<String, PathRefusal> {
    if !raw.starts_with('/') {
        return Err(PathRefusal::NotAbsolute);
    }
    let decoded = decode_unreserved(raw)?;
    if decoded.split('/').any(is_dot_segment_with_parameter) {
        return Err(PathRefusal::DotSegmentParameter);
    }
    Ok(remove_dot_segments(&decoded))
}

/// Decodes what may be decoded, keeps the rest encoded (upper-case hex),
/// refuses what is ambiguous.
fn decode_unreserved(raw: &str) -> Result<String, PathRefusal> {
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b != b'%' {
            check_raw(b)?;
            out.push(char::from(b));
            i += 1;
            continue;
        }
        let value = bytes.get(i + 1..i + 3).and_then(hex_pair).ok_or(PathRefusal::Malformed)?;
        refuse_ambiguous(value)?;
        if is_unreserved(value) {
            out.push(char::from(value));
        } else {
            out.push_str(&format!("%{value:02X}"));
        }
        i += 3;
    }
    Ok(out)
}

/// A raw byte of a path: hyper refuses most bad ones already; these are
/// the ones it lets through that servers read differently.
fn check_raw(b: u8) -> Result<(), PathRefusal> {
    match b {
        b'\\' => Err(PathRefusal::RawCharacter("backslash")),
        0..=0x20 | 0x7F => Err(PathRefusal::RawCharacter("control character or space")),
        0x80.. => Err(PathRefusal::RawCharacter("byte outside ASCII")),
        _ => Ok(()),
    }
}

fn refuse_ambiguous(value: u8) -> Result<(), PathRefusal> {
    match value {
        b'/' => Err(PathRefusal::Encoded("slash", "%2F")),
        b'\\' => Err(PathRefusal::Encoded("backslash", "%5C")),
        b'.' => Err(PathRefusal::Encoded("dot", "%2E")),
        b'%' => Err(PathRefusal::Encoded("percent sign, a double encoding", "%25")),
        0..=0x1F | 0x7F => Err(PathRefusal::Encoded("control character", "%00-%1F, %7F")),
        _ => Ok(()),
    }
}

fn hex_pair(pair: &[u8]) -> Option<u8> {
    let digit = |c: u8| char::from(c).to_digit(16);
    u8::try_from(digit(pair[0])? * 16 + digit(pair[1])?).ok()
}

/// RFC 3986 §2.3 (the dot is not here: its encoding is refused).
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~')
}

/// `.;x` or `..;x` (also with `;` encoded): a dot segment to servers that
/// strip path parameters before resolving.
fn is_dot_segment_with_parameter(segment: &str) -> bool {
    let cut = [segment.find(';'), segment.find("%3B")].into_iter().flatten().min();
    cut.is_some_and(|at| matches!(&segment[..at], "." | ".."))
}

/// RFC 3986 §5.2.4 for an absolute path: `.` segments go, `..` removes
/// the segment before it (never above the root); a dot segment at the end
/// leaves the path ending in `/`.
fn remove_dot_segments(path: &str) -> String {
    let segments: Vec<&str> = path[1..].split('/').collect();
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    for (i, segment) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *segment {
            "." => {}
            ".." => {
                out.pop();
            }
            other => {
                out.push(other);
                continue;
            }
        }
        if last {
            out.push("");
        }
    }
    format!("/{}", out.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_segments_are_removed_as_rfc_3986_says() {
        // RFC 3986 §5.4's examples that are absolute paths, and more.
        for (raw, normal) in [
            ("/", "/"),
            ("/simple/pkg", "/simple/pkg"),
            ("/simple/", "/simple/"),
            ("/a/b/c/./../../g", "/a/g"),
            ("/mid/content=5/../6", "/mid/6"),
            ("/simple/../admin", "/admin"),
            ("/simple/./pkg", "/simple/pkg"),
            ("/simple/.", "/simple/"),
            ("/simple/..", "/"),
            ("/..", "/"),
            ("/../../admin", "/admin"),
            ("/simple/x/../y", "/simple/y"),
            ("/a//../b", "/a/b"),
            ("/simple//pkg", "/simple//pkg"),
            ("/simple/...", "/simple/..."),
            ("/simple/..pkg", "/simple/..pkg"),
            ("/simple/pkg..", "/simple/pkg.."),
            ("/simple/a.b/c", "/simple/a.b/c"),
        ] {
            assert_eq!(normalize(raw).as_deref(), Ok(normal), "{raw}");
        }
    }

    #[test]
    fn unreserved_encodings_are_decoded_and_others_kept_upper_cased() {
        for (raw, normal) in [
            ("/%73imple/pkg", "/simple/pkg"),
            ("/%53IMPLE", "/SIMPLE"),
            ("/a%2db%5fc%7Ed%30", "/a-b_c~d0"),
            ("/a%20b", "/a%20b"),
            ("/caf%c3%a9", "/caf%C3%A9"),
            ("/a%3fb%23c", "/a%3Fb%23c"),
            ("/a;b/c", "/a;b/c"),
            ("/simple/pkg;v=1", "/simple/pkg;v=1"),
        ] {
            assert_eq!(normalize(raw).as_deref(), Ok(normal), "{raw}");
        }
    }

    #[test]
    fn ambiguous_paths_are_refused() {
        for raw in [
            "/simple/%2e%2e/admin",
            "/simple/%2E%2E/admin",
            "/simple/.%2e/admin",
            "/simple/%2e/admin",
            "/simple%2f..%2fadmin",
            "/simple/..%2Fadmin",
            "/simple/..%5cadmin",
            "/simple/..\\admin",
            "/simple\\..\\admin",
            "/simple/%252e%252e/admin",
            "/simple/%25",
            "/simple/pkg%00.html",
            "/simple/pkg%0a",
            "/simple/pkg%7f",
            "/simple/..;/admin",
            "/simple/.;x/admin",
            "/simple/..;x=1/admin",
            "/simple/..%3B/admin",
            "/simple/..%3b/admin",
            "/simple/%",
            "/simple/%2",
            "/simple/%zz",
            "/simple/%2g",
            "/simple/a b",
            "/simple/\u{e9}",
            "/simple/\tx",
        ] {
            assert!(normalize(raw).is_err(), "{raw} was not refused: {:?}", normalize(raw));
        }
    }

    #[test]
    fn refusals_say_why_without_quoting_the_path() {
        assert_eq!(
            normalize("/a/%2e%2e/b").unwrap_err().to_string(),
            "an encoded dot (%2E): servers differ on decoding it"
        );
        assert_eq!(normalize("/a/%2Fsecret").unwrap_err(), PathRefusal::Encoded("slash", "%2F"));
        assert_eq!(normalize("/a/%252e").unwrap_err(), PathRefusal::Encoded("percent sign, a double encoding", "%25"));
        assert_eq!(normalize("/a/..;/b").unwrap_err(), PathRefusal::DotSegmentParameter);
        assert_eq!(normalize("a/b").unwrap_err(), PathRefusal::NotAbsolute);
        assert_eq!(normalize("*").unwrap_err(), PathRefusal::NotAbsolute);
        let why = normalize("/token-s3cr3t/%2f").unwrap_err().to_string();
        assert!(!why.contains("s3cr3t"), "{why}");
    }

    #[test]
    fn a_normal_path_is_its_own_normal_form() {
        for raw in ["/simple/../admin", "/%73imple/./x", "/a/%c3%a9/../b", "/x/y/.."] {
            let once = normalize(raw).unwrap();
            assert_eq!(normalize(&once), Ok(once.clone()), "{raw}");
        }
    }
}
