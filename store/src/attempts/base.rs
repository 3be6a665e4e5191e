//! The one base commit of a group's attempts: whichever attempt checks out
//! first pins the commit it got on the group; the others check out that.

use uuid::Uuid;

use crate::{Store, StoreError};

impl Store {
    /// The commit group `group`'s attempts start from, once one pinned it.
    pub async fn group_base(&self, group: Uuid) -> Result<Option<String>, StoreError> {
        let client = self.client().await?;
        let row = client.query_opt("SELECT group_base_commit FROM runs WHERE id = $1", &[&group]).await?;
        Ok(row.map(|r| r.try_get::<_, Option<String>>(0)).transpose()?.flatten())
    }

    /// Pins `commit` as group `group`'s base unless one is pinned already;
    /// returns the group's base either way (`None`: no such group).
    pub async fn pin_group_base(&self, group: Uuid, commit: &str) -> Result<Option<String>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "UPDATE runs SET group_base_commit = COALESCE(group_base_commit, $2) WHERE id = $1
                 RETURNING group_base_commit",
                &[&group, &commit],
            )
            .await?;
        Ok(row.map(|r| r.try_get::<_, Option<String>>(0)).transpose()?.flatten())
    }
}
