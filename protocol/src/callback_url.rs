//! What a run's `callback_url` may be, checked without the network (the
//! worker decides whether its host may be reached, after resolving it).
//! The reason is a phrase that follows "callback_url".

use crate::input::{self, MAX_CALLBACK_URL_CHARS};

/// Checks what can be checked without the network: an http(s) URL with a
/// host, bounded in length, without credentials (the callback is signed
/// instead; a password in a URL ends up in logs). Whether the host is one
/// a worker may reach is decided by the worker, after resolving it.
///
/// The rule is [`input::CALLBACK_URL`]; the checks before it only say
/// better what is wrong.
pub fn check(raw: &str) -> Result<(), String> {
    let chars = raw.chars().count();
    if chars > MAX_CALLBACK_URL_CHARS {
        return Err(format!("is {chars} characters; the limit is {MAX_CALLBACK_URL_CHARS}"));
    }
    // The URL parser quietly drops surrounding whitespace and tabs; refuse
    // them so that what is stored is what is called.
    if raw.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain whitespace or control characters".into());
    }
    let url = url::Url::parse(raw).map_err(|e| format!("is not a URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("must be http or https, not {}", url.scheme()));
    }
    if url.host().is_none() {
        return Err("must name a host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "must not carry credentials (user:password@); callbacks are signed with KILN_CALLBACK_SECRET instead"
                .into(),
        );
    }
    if url.fragment().is_some() {
        return Err("must not have a #fragment (it is never sent)".into());
    }
    if !input::CALLBACK_URL.accepts(raw) {
        return Err(
            "must name its host as a DNS name (no `--`, the last label starting with a letter) or an IP address, \
             with a port of at most 65535"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::SpecError;

    #[test]
    fn http_and_https_urls_pass() {
        for ok in ["https://hooks.example.com/kiln", "http://127.0.0.1:9000/cb?x=1", "https://[::1]:8443/"] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn other_schemes_credentials_and_oversized_urls_are_refused() {
        let long = format!("https://example.com/{}", "a".repeat(MAX_CALLBACK_URL_CHARS));
        for bad in [
            "ftp://example.com/x",
            "file:///etc/passwd",
            "gopher://example.com",
            "https://user:pw@example.com/",
            "https://token@example.com/",
            "not a url",
            "https://example.com/ x",
            " https://example.com/",
            "https://example.com/#frag",
            long.as_str(),
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_reason_names_the_problem() {
        let e = SpecError::CallbackUrl(check("https://u:p@example.com/").unwrap_err()).to_string();
        assert!(e.starts_with("callback_url must not carry credentials"), "{e}");
        let e = check("ftp://example.com/").unwrap_err();
        assert!(e.contains("http or https"), "{e}");
    }
}
