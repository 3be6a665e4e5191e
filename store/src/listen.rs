//! One LISTEN connection per process, fanned out to many subscribers.
//!
//! Notifications are hints, not data: a subscriber that wakes re-reads the
//! table. After a reconnect [`Notice::Reconnected`] tells subscribers that
//! notifications may have been missed, so they poll.

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::broadcast;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::channels;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    Notification {
        channel: String,
        payload: String,
    },
    /// The connection was re-established; anything may have been missed.
    Reconnected,
}

/// Receives notifications on Kiln's channels. Dropping the last clone stops
/// the background task.
#[derive(Clone)]
pub struct Listener {
    sender: broadcast::Sender<Notice>,
    _task: std::sync::Arc<TaskGuard>,
}

struct TaskGuard(tokio::task::JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Listener {
    pub(crate) fn start(config: tokio_postgres::Config) -> Listener {
        // Subscribers that fall behind by this many notices get a `Lagged`
        // error and must re-read; they never block the listener.
        let (sender, _) = broadcast::channel(4096);
        let task = tokio::spawn(listen_forever(config, sender.clone()));
        Listener { sender, _task: std::sync::Arc::new(TaskGuard(task)) }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.sender.subscribe()
    }
}

async fn listen_forever(config: tokio_postgres::Config, sender: broadcast::Sender<Notice>) {
    let mut backoff = Duration::from_millis(100);
    let mut first = true;
    loop {
        match config.connect(NoTls).await {
            Ok((client, mut connection)) => {
                let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                // The connection must be polled for the LISTEN queries to
                // complete, so drive both together.
                let statement = format!(
                    "LISTEN {}; LISTEN {}; LISTEN {}; LISTEN {}; LISTEN {}; LISTEN {};",
                    channels::RUNS_QUEUED,
                    channels::RUN_EVENTS,
                    channels::RUN_CANCEL,
                    channels::RUN_CONTROL,
                    channels::CALLBACKS_OWED,
                    channels::ENVIRONMENT_CHANGED
                );
                let listen = client.batch_execute(&statement);
                tokio::pin!(listen);
                let mut listening = false;
                loop {
                    tokio::select! {
                        res = &mut listen, if !listening => {
                            if let Err(e) = res {
                                tracing::warn!(error = %e, "LISTEN failed");
                                break;
                            }
                            listening = true;
                            backoff = Duration::from_millis(100);
                            if !first {
                                let _ = sender.send(Notice::Reconnected);
                            }
                            first = false;
                        }
                        msg = messages.next() => match msg {
                            Some(Ok(AsyncMessage::Notification(n))) => {
                                let _ = sender.send(Notice::Notification {
                                    channel: n.channel().to_owned(),
                                    payload: n.payload().to_owned(),
                                });
                            }
                            Some(Ok(_)) => {}
                            Some(Err(e)) => {
                                tracing::warn!(error = %e, "LISTEN connection failed; reconnecting");
                                break;
                            }
                            None => break,
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "LISTEN connect failed; retrying in {backoff:?}"),
        }
        first = false;
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
