use super::*;
use crate::input;

/// Every character that `class` (a character class's inside) matches is one
/// `is` says yes to, and the other way round.
fn class_is(class: &str, is: fn(char) -> bool) {
    let regex = Regex::new(&format!("^[{class}]$")).unwrap();
    let differ: Vec<char> = (0..=0x10FFFF_u32)
        .filter_map(char::from_u32)
        .filter(|c| regex.is_match(c.encode_utf8(&mut [0; 4])) != is(*c))
        .collect();
    assert!(differ.is_empty(), "{class} and the Rust predicate differ on {differ:?}");
}

#[test]
fn the_character_classes_are_rusts() {
    class_is(white_space!(), char::is_whitespace);
    class_is(control!(), char::is_control);
}

#[test]
fn every_pattern_compiles() {
    let texts: [&Text; 10] = [
        &input::PROMPT,
        &input::TOOL_NAME,
        &input::MCP_SERVER_NAME,
        &input::MODEL_NAME,
        &input::REPO_URL,
        &input::GIT_REF,
        &input::CALLBACK_URL,
        &input::CALL_ID,
        &input::DECISION_REASON,
        &Text::new(0, 1, PRINTABLE_ASCII),
    ];
    let image = [&input::IMAGE.text.pattern].into_iter().chain(&input::IMAGE.except);
    for pattern in texts.iter().map(|t| &t.pattern).chain(image) {
        assert!(Regex::new(pattern.source()).is_ok(), "{}", pattern.source());
    }
}

#[test]
fn not_blank_means_what_trim_means() {
    for blank in ["", " ", "\n\t\r", "\u{3000}\u{85}", "\u{a0}"] {
        assert!(!input::PROMPT.accepts(blank), "{blank:?}");
    }
    for ok in ["x", " x ", "\u{feff}", "a\nb", "\u{200b}"] {
        assert_eq!(input::PROMPT.accepts(ok), !ok.trim().is_empty(), "{ok:?}");
    }
    assert!(!input::PROMPT.accepts("a\0b"));
    assert!(!input::PROMPT.accepts(" \0"));
    assert!(input::PROMPT.accepts(&"é".repeat(input::MAX_PROMPT_CHARS)), "characters, not bytes");
    assert!(!input::PROMPT.accepts(&"a".repeat(input::MAX_PROMPT_CHARS + 1)));
}

#[test]
fn git_refs_have_no_double_dot_and_no_leading_dash() {
    for ok in ["main", "a.b", ".a", "a.", ".", "v1.2.3", "a-b", "refs/heads/x", "a.-b", ".-b"] {
        assert!(input::GIT_REF.accepts(ok), "{ok:?}");
    }
    for bad in ["", "-x", "a..b", "..", "a b", "a~1", "a^", "a:b", "a?", "a*", "a[", "a\\b", "x..", "..x", "a\u{85}"] {
        assert!(!input::GIT_REF.accepts(bad), "{bad:?}");
    }
}

#[test]
fn callback_urls_are_http_urls_of_a_host() {
    for ok in [
        "https://hooks.example.com/kiln",
        "http://127.0.0.1:9000/cb?x=1",
        "https://[::1]:8443/",
        "HTTPS://Example.COM",
        "http://localhost:65535?q",
        "https://[2001:db8::8a2e:370:7334]/x",
    ] {
        assert!(input::CALLBACK_URL.accepts(ok), "{ok:?}");
    }
    for bad in [
        "https://user@example.com/",
        "https://example.com/#f",
        "https://example.com:65536/",
        "https://256.1.1.1/",
        "https://a.123/",
        "https://xn--a.com/",
        "https://example.com\\@evil/",
        "ftp://example.com/",
        "https://[:::]/",
        "https://example.com/ x",
    ] {
        assert!(!input::CALLBACK_URL.accepts(bad), "{bad:?}");
    }
}

#[test]
fn ranges_and_sets() {
    assert!(input::MAX_COST_USD.contains(0.01) && !input::MAX_COST_USD.contains(0.0));
    assert!(!input::MAX_COST_USD.contains(f64::NAN));
    assert!(input::MAX_STEPS.contains(500) && !input::MAX_STEPS.contains(501) && !input::MAX_STEPS.contains(0));
    assert!(input::MODEL_PROVIDER.contains("anthropic") && !input::MODEL_PROVIDER.contains("local"));
    assert_eq!(input::MAX_COST_USD.keywords()["exclusiveMinimum"], json!(0.0));
    assert_eq!(input::MAX_STEPS.keywords()["maximum"], json!(500));
    assert_eq!(input::DECISION_REASON.keywords().get("minLength"), None);
}

#[test]
fn every_repo_url_of_the_documented_shape_parses() {
    let ok = [
        "https://github.com/o/r.git",
        "http://127.0.0.1:8080/o/r",
        "https://[::1]:443/r",
        "git://host.example/r",
        "ssh://git@host.example:2222/o/r",
        "git@github.com:o/r.git",
        "host.example:o/r",
        "host.example:/srv/r.git",
        "[::1]:r",
        "file:///srv/repos/r",
        "https://a/#frag",
    ];
    for url in ok {
        assert!(input::REPO_URL.accepts(url), "{url:?}");
        assert!(crate::repo_url::parse_repo_url(url).is_ok(), "{url:?} is of the shape but does not parse");
    }
    // Each refused by the shape, as the server refuses them.
    let bad = [
        "git@:0",
        "https://:80/x",
        "https://user:pw@host/x",
        "https://user@host/x",
        "https://a:99999/x",
        "ssh://u:p@host/x",
        "-uhttps://x",
        "ext::sh -c x",
        "file://host/x",
        "https://host name/x",
        "ssh://-oProxyCommand=x/y",
        "host://x",
        "host:a://b",
    ];
    for url in bad {
        assert!(!input::REPO_URL.accepts(url), "{url:?}");
    }
}
