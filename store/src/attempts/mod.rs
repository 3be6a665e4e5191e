//! Best-of-N attempts (issue 29): a group run and its attempt runs.
//!
//! A run submitted with `"attempts": N` is stored as a *group*: a row of
//! `runs` that no worker claims (it is `running` from its creation and never
//! holds a lease) with `attempt_count = N`, and N queued *attempts*, each a
//! run of its own in a session of its own, pointing at the group with
//! `group_run_id` and `attempt_number`. Workers claim and drive attempts
//! like any run; the group's stream gets a copy of each attempt's step-
//! and tool-level events ([`stream`]), an `attempt.finished` per attempt,
//! and its terminal event once every attempt has ended ([`end`]).
//! Choosing an attempt copies its captured change to the group ([`select`]).

mod base;
mod cancel;
mod create;
mod delivery;
mod end;
mod select;
mod stream;

pub(crate) use cancel::cancel_group_tx;
pub(crate) use create::{InsertedGroup, insert_group_tx};
pub use select::SelectOutcome;
