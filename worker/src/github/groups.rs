//! Reporting a group of attempts a GitHub comment asked for (`/kiln
//! --attempts N`, issue 29). The group owes its report through the same
//! owed delivery as a run (`owed`): when its attempts have all ended, and
//! again when one is chosen (`POST /v1/runs/{id}/select`, `/kiln select K`,
//! or the first to succeed when the deployment takes it,
//! `KILN_GITHUB_ATTEMPTS_TAKE_FIRST`). Each delivery reads the choice once
//! it holds the lease (the choice cannot change from then on):
//! - no choice yet: a comment listing the attempts (status, steps, cost,
//!   diffstat) and how to choose one; the group stays owed its pull request;
//! - a choice: its change (copied to the group by the choice) pushed as one
//!   commit and opened as the group's pull request, and a comment saying
//!   so with the list. A choice made through a comment is pushed only if its
//!   author may push to the repository, as for a run's sender.

use kiln_protocol::EventBody;
use kiln_store::{DeliveryJob, GithubOrigin, GroupChoice, Store};

use super::comment::{inline, quote};
use super::delivery::{Opened, admit, deliver_change, refused_text, summary};
use super::{Github, GithubError};

/// What a group's delivery came to.
pub struct Reported {
    pub pull_request: Option<String>,
    pub comment: Option<String>,
    /// The group's pull request is settled (opened, or the choice changed
    /// nothing): no choice may follow.
    pub delivered: bool,
}

/// Reports group `job.run` on its issue (see the module's docs).
pub async fn deliver(github: &Github, store: &Store, job: &DeliveryJob) -> Result<Reported, GithubError> {
    let client = &github.inner.client;
    let origin = &job.origin;
    let token = github.inner.auth.token(client, origin.installation_id, &origin.repo_full_name).await?;
    let attempts = attempts_table(&store.group_attempt_ends(job.run.id).await?);
    let link = github.run_link(job.run.id);
    let (body, pull_request, delivered) = match store.github_group_choice(job.run.id).await? {
        None => (summary_text(&link, job, &attempts), None, false),
        Some(choice) => {
            if let Some(by) = &choice.by {
                admit(github, &GithubOrigin { sender_login: by.clone(), ..origin.clone() }).await?;
            }
            let chosen =
                DeliveryJob { patch: choice.patch.clone(), patch_too_large: choice.patch_too_large, ..job.clone() };
            let opened = deliver_change(github, store, &token, &chosen, summary(&choice.run)).await?;
            let (text, pr) = chosen_text(&link, &choice, opened);
            (format!("{text}\n\n{attempts}"), pr, true)
        }
    };
    let comment = client.comment(&token, &origin.repo_full_name, origin.issue_number, &body).await?;
    Ok(Reported { pull_request, comment: Some(comment.html_url), delivered })
}

/// The comment for a group whose attempts have ended with none chosen.
fn summary_text(link: &str, job: &DeliveryJob, attempts: &str) -> String {
    let group = job.run.id;
    format!(
        "Kiln tried this {} times (group {link}):\n\n{attempts}\n\nTo open a pull request with one attempt's \
         change, comment `/kiln select K` (K: the attempt's number), or run `kiln select {group} K`, or `POST \
         /v1/runs/{group}/select` with `{{\"attempt\": K}}`.",
        job.run.attempts.as_ref().map_or(0, Vec::len),
    )
}

/// What the comment says of the chosen attempt; its pull request, if one
/// was opened.
fn chosen_text(link: &str, choice: &GroupChoice, opened: Opened) -> (String, Option<String>) {
    let k = choice.attempt;
    match opened {
        Opened::PullRequest(url) => {
            (format!("Kiln opened a pull request with attempt {k}'s change: {url}\n\nGroup {link}."), Some(url))
        }
        Opened::NoChange => (
            format!(
                "Attempt {k} of Kiln group {link} was chosen; it changed no file. Its answer:\n\n{}",
                quote(summary(&choice.run))
            ),
            None,
        ),
        Opened::Refused { workflow_paths } => {
            (refused_text(&format!("Attempt {k} of Kiln group {link}"), &workflow_paths), None)
        }
    }
}

/// The attempts as a Markdown table: status, steps, cost, diffstat.
fn attempts_table(ends: &[EventBody]) -> String {
    let mut rows = vec!["| attempt | status | steps | cost | changes |".to_owned(), "|---|---|---|---|---|".into()];
    let mut ends: Vec<_> = ends
        .iter()
        .filter_map(|e| match e {
            EventBody::AttemptFinished { attempt, status, steps, cost_usd, changes, .. } => {
                Some((*attempt, status, steps, cost_usd, changes))
            }
            _ => None,
        })
        .collect();
    ends.sort_by_key(|(attempt, ..)| *attempt);
    for (attempt, status, steps, cost, changes) in ends {
        let cost = cost.map_or("unknown".to_owned(), |c| format!("${c:.4}"));
        let changes = match changes {
            Some(c) if c.files > 0 => {
                let plural = if c.files == 1 { "" } else { "s" };
                format!("{} file{plural}, +{} −{}", c.files, c.additions, c.deletions)
            }
            Some(_) => "none".to_owned(),
            None => "not captured".to_owned(),
        };
        rows.push(format!("| {attempt} | {} | {steps} | {cost} | {changes} |", inline(status)));
    }
    rows.join("\n")
}

#[cfg(test)]
mod tests {
    use kiln_protocol::Usage;
    use kiln_protocol::changes::ChangeTotals;

    use super::*;

    #[test]
    fn the_table_lists_attempts_in_order_with_what_they_spent_and_changed() {
        let end = |attempt, status: &str, changes| EventBody::AttemptFinished {
            attempt,
            run_id: uuid::Uuid::nil(),
            status: status.into(),
            summary: String::new(),
            usage: Usage::default(),
            cost_usd: Some(0.5),
            steps: 3,
            changes,
        };
        let table = attempts_table(&[
            end(2, "failed", None),
            end(1, "succeeded", Some(ChangeTotals { files: 2, additions: 5, deletions: 1 })),
        ]);
        let expected = "| attempt | status | steps | cost | changes |\n|---|---|---|---|---|\n\
                        | 1 | succeeded | 3 | $0.5000 | 2 files, +5 −1 |\n| 2 | failed | 3 | $0.5000 | not captured |";
        assert_eq!(table, expected);
    }
}
