//! Steering: messages a client sends while the run works join the
//! conversation before the next model call (and keep a run that was about
//! to finish going).
//!
//! The inbox is read when a message was announced (NOTIFY), at least every
//! [`INBOX_POLL`] in case an announcement was missed, and always before the
//! run would end: a round trip saved on most steps.

use std::time::{Duration, Instant};

use kiln_protocol::Message;

use super::{AgentError, AgentRun, finished};
use crate::db_retry::with_retry;

/// Longest the loop goes without looking at the inbox when no message was
/// announced (a missed notification costs at most this much delay).
const INBOX_POLL: Duration = Duration::from_secs(1);

/// When the loop last read the inbox, and how many announcements it had
/// seen then.
#[derive(Debug, Default)]
pub(super) struct InboxWatch {
    checked: Option<(Instant, u64)>,
}

impl InboxWatch {
    /// Whether the inbox is worth a read, `announced` announcements in.
    fn due(&self, announced: u64) -> bool {
        self.checked.is_none_or(|(at, seen)| seen != announced || at.elapsed() >= INBOX_POLL)
    }
}

impl AgentRun<'_> {
    /// Adds the messages sent to the run since the last read to the
    /// conversation, when a read is due.
    pub(super) async fn read_inbox(
        &mut self,
        watch: &mut InboxWatch,
        messages: &mut Vec<Message>,
    ) -> Result<(), AgentError> {
        let announced = self.control.announced();
        if !watch.due(announced) && finished(messages).is_none() {
            return Ok(());
        }
        watch.checked = Some((Instant::now(), announced));
        let unread = with_retry(|| self.store.unread_inbox(self.run.id)).await?;
        if !unread.is_empty() {
            // The step's tool message, still held for the next model call
            // (`AgentRun::hold`), goes first: it answers the calls of the
            // message before it, and nothing may come between them.
            self.events.commit().await?;
            // Consumed in the commit that stores them: the same messages on
            // a retry, so it stores nothing twice.
            with_retry(|| self.store.consume_inbox(self.lease, self.run.session_id, &unread)).await?;
            messages.extend(unread.into_iter().map(|m| Message::user(m.text)));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inbox_is_read_first_then_on_an_announcement_or_after_the_poll_interval() {
        let mut watch = InboxWatch::default();
        assert!(watch.due(0), "never read yet");
        watch.checked = Some((Instant::now(), 3));
        assert!(!watch.due(3), "read just now, nothing announced since");
        assert!(watch.due(4), "a message was announced");
        watch.checked = Some((Instant::now() - INBOX_POLL, 3));
        assert!(watch.due(3), "an announcement may have been missed");
    }
}
