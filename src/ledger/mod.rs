//! The credit ledger: one pricing function, append-only two-phase entries, durable
//! stores (SQLite, PostgreSQL) and streaming exports (CSV, FOCUS 1.2, JSON lines).

pub mod admission;
pub mod budget;
pub mod charge;
#[doc(hidden)]
pub mod conformance;
pub mod decimal;
pub mod drift;
pub mod entry;
pub mod export;
pub mod lifecycle;
pub mod pricing;
pub mod store;

pub use entry::{Balances, Entry, EntryKind};
pub use pricing::{Rate, cumulative, price_interval};
pub use store::{
    AppendOutcome, EntryFilter, LedgerStore, PostgresStore, SqliteStore, Store, StoreError,
    VerifyReport, for_each_entry, verify,
};
