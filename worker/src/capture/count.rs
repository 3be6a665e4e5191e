//! Line counts read off a `git diff --binary` patch, as `--numstat` would
//! give them, so the capture's diff need not count every file a second
//! time: per file section (`diff --git …`), each hunk's `+` and `-` lines,
//! the hunk's header saying how many lines it holds (so a content line that
//! looks like a header is never taken for one); a binary file counts none.
//! The patch is the sandbox's (hostile): whatever it holds, this returns
//! counts, never panics, and reads each byte once.

/// One file section's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub additions: u64,
    pub deletions: u64,
    pub binary: bool,
}

/// The counts of each file section of `patch`, in order.
pub fn count_patch(patch: &[u8]) -> Vec<Counts> {
    let mut sections: Vec<Counts> = Vec::new();
    // Lines still to come in the current hunk: (old side, new side).
    let mut hunk = (0u64, 0u64);
    for line in patch.split(|b| *b == b'\n') {
        if hunk != (0, 0) {
            let Some(current) = sections.last_mut() else { break };
            match line.first() {
                Some(b'+') => {
                    current.additions = current.additions.saturating_add(1);
                    hunk.1 = hunk.1.saturating_sub(1);
                }
                Some(b'-') => {
                    current.deletions = current.deletions.saturating_add(1);
                    hunk.0 = hunk.0.saturating_sub(1);
                }
                Some(b'\\') => {}
                _ => hunk = (hunk.0.saturating_sub(1), hunk.1.saturating_sub(1)),
            }
        } else if line.starts_with(b"diff --git ") {
            sections.push(Counts::default());
        } else if let Some(current) = sections.last_mut() {
            if line.starts_with(b"@@ -") {
                hunk = hunk_lines(line).unwrap_or((0, 0));
            } else if line == b"GIT binary patch" || (line.starts_with(b"Binary files ") && line.ends_with(b" differ"))
            {
                current.binary = true;
            }
        }
    }
    sections
}

/// `(old, new)` line counts of a hunk header `@@ -o[,l] +n[,m] @@…`.
fn hunk_lines(line: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(line.get(4..)?).ok()?;
    let (old, rest) = text.split_once(" +")?;
    let (new, _) = rest.split_once(" @@")?;
    let length = |range: &str| match range.split_once(',') {
        Some((_, n)) => n.parse::<u64>().ok(),
        None => range.parse::<u64>().ok().map(|_| 1),
    };
    Some((length(old)?, length(new)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(additions: u64, deletions: u64, binary: bool) -> Counts {
        Counts { additions, deletions, binary }
    }

    #[test]
    fn hunks_are_counted_by_their_headers() {
        let patch = b"diff --git a/f b/f\nindex 1..2 100644\n--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@ ctx\n a\n-b\n+diff --git x\n\
--- c\n+++ d\n@@ -9 +9,0 @@\n-z\n\\ No newline at end of file\n\
diff --git a/bin b/bin\nnew file mode 100644\nindex 0..3\nGIT binary patch\nliteral 3\nKcmZ?d\n\nliteral 0\nHcmV?d00001\n\n\
diff --git a/m b/m\nold mode 100644\nnew mode 100755\n\
diff --git a/l b/l\nnew file mode 120000\nindex 0..4\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+g\n\\ No newline at end of file\n";
        assert_eq!(
            count_patch(patch),
            [counts(2, 3, false), counts(0, 0, true), counts(0, 0, false), counts(1, 0, false)]
        );
    }

    #[test]
    fn garbage_counts_something_and_never_panics() {
        for patch in [
            &b""[..],
            b"@@ -1 +1 @@\n+x\n",
            b"diff --git a b\n@@ -18446744073709551615,99999999999999999999 +1 @@\n",
            b"\xff\n\n",
        ] {
            let _ = count_patch(patch);
        }
        assert_eq!(count_patch(b"diff --git a b\n@@ -1,1000 +1,1000 @@\n+x\n-y\n"), [counts(1, 1, false)]);
        assert_eq!(
            count_patch(b"diff --git a b\n@@ -a +1 @@\n+x\n"),
            [counts(0, 0, false)],
            "a bad header starts no hunk"
        );
    }
}
