//! The API address a client is pointed at (`KILN_URL`/`--url`), checked
//! before any request, and failures to reach it told as what to do.

use std::fmt;

/// Where `kiln` looks when nothing is set; `kiln up` serves here.
pub const DEFAULT: &str = "http://127.0.0.1:8080";

/// Why a `KILN_URL` cannot be used, each with its fix.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BaseUrlError {
    #[error("KILN_URL/--url {0:?} is not a URL: write it with its scheme, like {DEFAULT}")]
    NoScheme(String),
    #[error("KILN_URL/--url {0:?} is not a URL ({1}); it should look like {DEFAULT}")]
    Malformed(String, String),
    #[error("KILN_URL/--url {0:?} must be an http:// or https:// URL, like {DEFAULT}")]
    Scheme(String),
    #[error("KILN_URL/--url {given:?} is the server's base URL without the API's path: use {base}")]
    HasApiPath { given: String, base: String },
}

/// A checked base URL, without a trailing slash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl(String);

impl BaseUrl {
    pub fn parse(given: &str) -> Result<BaseUrl, BaseUrlError> {
        let trimmed = given.trim();
        let url = match reqwest::Url::parse(trimmed) {
            Ok(url) => url,
            // `127.0.0.1:8080` is read as a relative URL, which has no
            // base: the scheme is what is missing.
            Err(url::ParseError::RelativeUrlWithoutBase) => return Err(BaseUrlError::NoScheme(given.to_owned())),
            Err(e) => return Err(BaseUrlError::Malformed(given.to_owned(), e.to_string())),
        };
        // `localhost:8080` parses with `localhost` as its scheme.
        if !matches!(url.scheme(), "http" | "https") {
            return Err(if url.cannot_be_a_base() || !trimmed.contains("://") {
                BaseUrlError::NoScheme(given.to_owned())
            } else {
                BaseUrlError::Scheme(given.to_owned())
            });
        }
        let path = url.path().trim_end_matches('/');
        if path == "/v1" || path.starts_with("/v1/") {
            let mut base = url.clone();
            base.set_path("");
            return Err(BaseUrlError::HasApiPath {
                given: given.to_owned(),
                base: base.as_str().trim_end_matches('/').to_owned(),
            });
        }
        Ok(BaseUrl(url.as_str().trim_end_matches('/').to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A request that never got an answer, said as what the user can do.
pub fn unreachable(base: &BaseUrl, error: &reqwest::Error) -> String {
    let why = if error.is_connect() {
        "nothing answered there"
    } else if error.is_timeout() {
        "it did not answer in time"
    } else {
        "the connection failed"
    };
    let kiln = crate::invocation::kiln();
    format!(
        "cannot reach Kiln at {base}: {why} ({}).\n\
         Is Kiln running? Start it with `{kiln} up` (or `{kiln} serve` and `{kiln} worker`), \
         or point KILN_URL/--url at the server",
        innermost(error)
    )
}

/// The last cause in the chain (`Connection refused (os error 111)`), which
/// says the most in the fewest words.
fn innermost(error: &(dyn std::error::Error + 'static)) -> String {
    let mut last: &(dyn std::error::Error + 'static) = error;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_base_url_is_kept_without_its_trailing_slash() {
        assert_eq!(BaseUrl::parse("http://127.0.0.1:8080/").unwrap().as_str(), "http://127.0.0.1:8080");
        assert_eq!(BaseUrl::parse("https://kiln.example/prefix").unwrap().as_str(), "https://kiln.example/prefix");
    }

    #[test]
    fn a_missing_scheme_names_the_fix() {
        for given in ["127.0.0.1:8080", "localhost:8080", "kiln.internal"] {
            let e = BaseUrl::parse(given).unwrap_err();
            assert_eq!(e, BaseUrlError::NoScheme(given.into()), "{given}");
            assert!(e.to_string().contains("http://127.0.0.1:8080"), "{e}");
        }
    }

    #[test]
    fn other_schemes_are_refused() {
        assert_eq!(BaseUrl::parse("ftp://host/").unwrap_err(), BaseUrlError::Scheme("ftp://host/".into()));
    }

    #[test]
    fn the_api_path_is_named_with_the_base_to_use() {
        let e = BaseUrl::parse("http://127.0.0.1:8080/v1/").unwrap_err();
        assert_eq!(
            e,
            BaseUrlError::HasApiPath {
                given: "http://127.0.0.1:8080/v1/".into(),
                base: "http://127.0.0.1:8080".into()
            }
        );
        assert!(BaseUrl::parse("http://h/v1/runs").is_err());
        assert!(BaseUrl::parse("http://h/v10").is_ok());
    }
}
