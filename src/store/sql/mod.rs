//! The one SQL implementation of [`JournalStore`](super::JournalStore), for every backend:
//! the statements are the `.sql` files here (see `README.md`), rendered once per store for
//! its [`Dialect`]; the parameters of each are bound once, as a list of [`Arg`]; rows decode
//! with `derive(FromRow)` into row types and then into domain types through `TryFrom`.
//! Every statement runs inside `SqlStore::call`, which traces it under its table and counts
//! its failures.
//!
//! One concern a file, each importing only the ones listed before it:
//!
//! | file | concern |
//! |---|---|
//! | `clock.rs` | the clock statements read ([`Clock`]) |
//! | `bind.rs` | values in parameter order ([`Arg`]), batch columns |
//! | `dialect.rs` | what a backend adds ([`Dialect`]): tokens, running, failures |
//! | `render.rs` | a statement file made SQL for a dialect |
//! | `statements.rs` | every statement, rendered once, with its kind and table |
//! | `rows.rs` | decoding rows into records, events, outbox entries |
//! | `store.rs` | [`SqlStore`]: settings, running a statement, one register or report |
//! | `batch.rs` | group commit's batches (the queues are `store::group_commit`) |
//! | `journal_store.rs` | the journal's methods |
//! | `outbox.rs` | the outbox's methods |

mod batch;
mod bind;
mod clock;
mod dialect;
mod journal_store;
mod outbox;
mod render;
mod rows;
mod statements;
mod store;

pub(super) use bind::arguments;
pub use bind::{Arg, BindColumns};
pub use clock::Clock;
pub use dialect::{Decoded, Dialect};
pub(super) use dialect::{classify_by, run_on};
pub use store::SqlStore;
