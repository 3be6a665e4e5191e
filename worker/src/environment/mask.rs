//! Secret values masked out of a script's output as it streams.
//!
//! Output arrives in pieces cut wherever the pipe was read, so a secret
//! can be split across two pieces (a script that prints it byte by byte
//! splits it across many). What is sent is therefore never the last bytes
//! that could still be the start of a secret: those wait for what follows
//! (or for the end), and a piece never ends inside a secret.
//!
//! Matching ignores ASCII case: what reaches an event is not always what
//! the script wrote. A host name is lower-cased on its way (the egress
//! proxy's `network.denied` events and its refusal's text), so a token
//! requested as `http://$TOKEN.example/` comes back lower-case.

use std::sync::Arc;

/// What is shown instead of a secret.
pub const MASK: &str = "[secret]";
/// Values shorter than this are not masked (every `1` would be).
pub const MIN_SECRET_BYTES: usize = 4;

pub struct Masker<'a> {
    secrets: Vec<&'a [u8]>,
    /// Bytes kept back at the end of the pending output: the longest
    /// secret less one.
    hold: usize,
    pending: Vec<u8>,
}

impl<'a> Masker<'a> {
    pub fn new(secrets: &[&'a str]) -> Self {
        let secrets: Vec<&[u8]> =
            secrets.iter().map(|s| s.as_bytes()).filter(|s| s.len() >= MIN_SECRET_BYTES).collect();
        let hold = secrets.iter().map(|s| s.len() - 1).max().unwrap_or(0);
        Masker { secrets, hold, pending: Vec::new() }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    /// Bytes received and not yet taken.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The output that can be shown now, masked: all but what could be the
    /// start of a secret (or of a UTF-8 character).
    pub fn take(&mut self) -> String {
        let cut = self.safe_cut();
        let shown: Vec<u8> = self.pending.drain(..cut).collect();
        masked_bytes(&shown, &self.secrets)
    }

    /// Everything left, masked: the output has ended.
    pub fn finish(&mut self) -> String {
        let shown = std::mem::take(&mut self.pending);
        masked_bytes(&shown, &self.secrets)
    }

    /// Where the pending bytes can be cut: before the last `hold` bytes,
    /// not inside a secret, not inside a UTF-8 character.
    fn safe_cut(&self) -> usize {
        let bytes = &self.pending;
        let mut cut = bytes.len().saturating_sub(self.hold);
        loop {
            let before = cut;
            while cut > 0 && cut < bytes.len() && bytes[cut] & 0xC0 == 0x80 {
                cut -= 1;
            }
            for secret in &self.secrets {
                // An occurrence starting before the cut and ending after it.
                let first = (cut + 1).saturating_sub(secret.len());
                if let Some(start) = (first..cut).find(|&s| starts_with_secret(&bytes[s..], secret)) {
                    cut = cut.min(start);
                }
            }
            if cut == before {
                return cut;
            }
        }
    }
}

/// A masking function over `secrets`, for what the setup phase makes
/// besides the script's output (the egress proxy's events and log lines).
pub fn redactor(secrets: impl IntoIterator<Item = String>) -> Arc<dyn Fn(&str) -> String + Send + Sync> {
    let secrets: Vec<String> = secrets.into_iter().collect();
    Arc::new(move |text| masked(text, &secrets.iter().map(String::as_str).collect::<Vec<_>>()))
}

/// `text` with every secret replaced by [`MASK`].
pub fn masked(text: &str, secrets: &[&str]) -> String {
    let secrets: Vec<&[u8]> = secrets.iter().map(|s| s.as_bytes()).filter(|s| s.len() >= MIN_SECRET_BYTES).collect();
    masked_bytes(text.as_bytes(), &secrets)
}

fn masked_bytes(bytes: &[u8], secrets: &[&[u8]]) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    'scan: while i < bytes.len() {
        for secret in secrets {
            if starts_with_secret(&bytes[i..], secret) {
                out.extend_from_slice(MASK.as_bytes());
                i += secret.len();
                continue 'scan;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn starts_with_secret(bytes: &[u8], secret: &[u8]) -> bool {
    bytes.get(..secret.len()).is_some_and(|head| head.eq_ignore_ascii_case(secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is shown when `output` arrives in pieces of `size` bytes, taken
    /// after each.
    fn streamed(output: &str, size: usize, secrets: &[&str]) -> String {
        let mut masker = Masker::new(secrets);
        let mut shown = String::new();
        for piece in output.as_bytes().chunks(size) {
            masker.push(piece);
            shown.push_str(&masker.take());
        }
        shown + &masker.finish()
    }

    #[test]
    fn a_secret_split_across_pieces_is_masked_however_it_is_cut() {
        let output = "token=s3cr3t-VALUE and again s3cr3t-VALUE, short 123, héllo wörld s3cr3t-VALUE";
        let expected = "token=[secret] and again [secret], short 123, héllo wörld [secret]";
        for size in 1..output.len() + 1 {
            assert_eq!(streamed(output, size, &["s3cr3t-VALUE", "123"]), expected, "pieces of {size}");
        }
    }

    #[test]
    fn overlapping_and_nested_secrets_are_masked() {
        for size in 1..12 {
            let shown = streamed("xxabcdefgh-yy abcd", size, &["abcdefgh", "defg", "abcd"]);
            assert!(!shown.contains("abcd") && !shown.contains("defg"), "{size}: {shown}");
        }
    }

    #[test]
    fn a_secret_whose_case_was_changed_on_the_way_is_masked() {
        let secret = "Kiln-S3cret-Token";
        for size in 1..20 {
            let shown = streamed("refused kiln-s3cret-token.example:80 and KILN-S3CRET-TOKEN", size, &[secret]);
            assert_eq!(shown, "refused [secret].example:80 and [secret]", "{size}");
        }
        assert_eq!(redactor([secret.to_owned()])("host kiln-s3cret-token.example"), "host [secret].example");
    }

    #[test]
    fn without_secrets_everything_is_shown_at_once() {
        let mut masker = Masker::new(&[]);
        masker.push("héllo".as_bytes());
        assert_eq!(masker.take(), "héllo");
        assert_eq!(masker.pending(), 0);
    }
}
