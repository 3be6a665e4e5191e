//! Follow-up runs: a new run in a finished run's session, asking what was
//! sent to it. It continues the same task: it takes the run's model,
//! limits, policy and callback (whoever asked to be called back when the
//! run ended hears of the follow-up's end too), and is queued as every run
//! is (`queued`).
//!
//! Two things make one: a message to a finished run (`Store::send_message`),
//! and messages accepted (202) while a run was active that it ended without
//! reading (they came after the worker's last look at the inbox). For the
//! second, the transaction that ends the run, whoever ends it, marks it as
//! owing a follow-up (`runs.follow_up_owed`, set by the trigger of
//! `migrations/V15`); whoever ended it then queues the follow-up at once
//! (`queue`, `end_batch`, the reaper), and the reaper's sweep does if that
//! process stopped in between. The mark is what makes it durable: such a
//! message is never lost, at worst it waits for the sweep.

use kiln_protocol::Trigger;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::queued::{QueuedRun, Session, insert_queued_run_tx};
use crate::{Store, StoreError};

/// The columns of the run a follow-up continues that it takes over, as
/// [`Source::from_row`] reads them.
const SOURCE: &str = "session_id, owner, model, limits, policy, callback_url";

/// The run a follow-up continues.
struct Source {
    session_id: Uuid,
    owner: String,
    model: serde_json::Value,
    limits: serde_json::Value,
    policy: serde_json::Value,
    callback_url: Option<String>,
}

impl Source {
    fn from_row(row: &Row) -> Result<Self, StoreError> {
        let mut policy: serde_json::Value = row.try_get(4)?;
        // `deliver.git` pushes the run's branch once: a follow-up's push
        // would find the branch taken (Kiln never overwrites one), so the
        // follow-up does not inherit it.
        if let Some(p) = policy.as_object_mut() {
            p.remove("deliver");
        }
        Ok(Source {
            session_id: row.try_get(0)?,
            owner: row.try_get(1)?,
            model: row.try_get(2)?,
            limits: row.try_get(3)?,
            policy,
            callback_url: row.try_get(5)?,
        })
    }

    /// Queues its follow-up asking `question`, in the caller's transaction.
    async fn follow_up_tx(self, tx: &deadpool_postgres::Transaction<'_>, question: &str) -> Result<Uuid, StoreError> {
        let run = QueuedRun {
            owner: &self.owner,
            prompt: question,
            model: self.model,
            limits: self.limits,
            policy: self.policy,
            callback_url: self.callback_url.as_deref(),
            trigger: Trigger::Api,
            idempotency_key: None,
            session: Session::Existing(self.session_id),
        };
        insert_queued_run_tx(tx, &run)
            .await?
            .ok_or_else(|| StoreError::Corrupt("a run without an idempotency key conflicted".into()))
    }
}

/// Queues a follow-up of run `id` asking `question`, in the caller's
/// transaction (which has checked that the session has no active run).
pub(crate) async fn queue_follow_up_tx(
    tx: &deadpool_postgres::Transaction<'_>,
    id: Uuid,
    question: &str,
) -> Result<Uuid, StoreError> {
    let row = tx.query_one(&format!("SELECT {SOURCE} FROM runs WHERE id = $1"), &[&id]).await?;
    Source::from_row(&row)?.follow_up_tx(tx, question).await
}

/// Queues the follow-up run `id`'s end owes, if it still owes one: the
/// messages it left unread, oldest first, as one prompt. The mark is taken
/// first, which locks the run row, and cleared in the commit that queues the
/// follow-up: whoever tries at once, one follow-up is made.
pub(crate) async fn take_owed_follow_up_tx(
    tx: &deadpool_postgres::Transaction<'_>,
    id: Uuid,
) -> Result<Option<Uuid>, StoreError> {
    let owed = tx
        .query_opt(
            &format!("UPDATE runs SET follow_up_owed = false WHERE id = $1 AND follow_up_owed RETURNING {SOURCE}"),
            &[&id],
        )
        .await?;
    let Some(owed) = owed else { return Ok(None) };
    let unread = tx
        .query_one(
            "WITH taken AS (
                 UPDATE run_inbox SET consumed_at = now()
                 WHERE run_id = $1 AND consumed_at IS NULL
                 RETURNING id, text
             )
             SELECT array_agg(text ORDER BY id) FROM taken",
            &[&id],
        )
        .await?;
    // The mark is set only with messages unread, and nothing else reads the
    // inbox of an ended run; an empty one leaves nothing to ask.
    let Some(texts) = unread.try_get::<_, Option<Vec<String>>>(0)? else { return Ok(None) };
    Source::from_row(&owed)?.follow_up_tx(tx, &texts.join("\n\n")).await.map(Some)
}

/// Most owed follow-ups one sweep queues; the next sweep takes the rest.
const SWEEP_LIMIT: i64 = 100;

impl Store {
    /// Queues the follow-ups owed by runs this process has just ended (the
    /// end statement said which owe one). A failure is left to the sweep:
    /// the end itself has committed and stands.
    pub(crate) async fn queue_owed_follow_ups(&self, ended: &[Uuid]) {
        for &run_id in ended {
            if let Err(e) = self.queue_owed_follow_up(run_id).await {
                tracing::warn!(%run_id, error = %e, "queueing the follow-up of messages the run left unread failed; the reaper's sweep will");
            }
        }
    }

    async fn queue_owed_follow_up(&self, run_id: Uuid) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let follow_up = take_owed_follow_up_tx(&tx, run_id).await?;
        tx.commit().await?;
        if let Some(follow_up) = follow_up {
            self.announce_queued(follow_up);
        }
        Ok(())
    }

    /// Queues the follow-ups still owed by runs whose end was not followed
    /// by it: the process that ended them stopped in between.
    pub(crate) async fn sweep_owed_follow_ups(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        let rows = client.query("SELECT id FROM runs WHERE follow_up_owed LIMIT $1", &[&SWEEP_LIMIT]).await?;
        drop(client);
        let owed = rows.iter().map(|r| r.try_get(0)).collect::<Result<Vec<Uuid>, _>>()?;
        self.queue_owed_follow_ups(&owed).await;
        Ok(())
    }
}
