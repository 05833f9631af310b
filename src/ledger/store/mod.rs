//! Durable ledger stores: one trait, an embedded SQLite file and PostgreSQL.
//!
//! Schema (migration 1, same columns on both backends):
//! `entries(id, idempotency_key UNIQUE, kind, budget, team, workload_namespace,
//! workload_name, workload_uid, admission, class, flavor, resource, device_units,
//! interval_start, interval_end, credits, rate_card, reason, created_at)` with
//! indexes on `(budget, created_at)` and `(interval_start)`; applied versions are
//! recorded in `schema_migrations(version, applied_at)`.
//!
//! Migration 2 adds the indexes of the AdmissionCheck queries:
//! `(workload_uid, admission, kind)` (a workload's entries, a reservation's posts
//! and void), `(budget, kind, interval_end)` (posted credits of a period) and a
//! partial index of the Reserve entries (open reservations).
//!
//! Migration 3 adds `rate` (micro-credits per device-hour the entry was priced
//! with; 0 on older rows), so an export reads unit prices from the entry.
//! Migration 4 adds `devices` (the cards the admission held).
//!
//! Migration 5 numbers workloads (`workload_ids(seq, uid UNIQUE)`, in the order
//! each UID first reached the ledger) and makes `(workload_seq,
//! idempotency_key)` the table's unique key, replacing the key's own UNIQUE and
//! the `(workload_uid, admission, kind)` index: both were ordered by random
//! UIDs, so once the ledger outgrew memory every append wrote a page of each
//! (SQLite fell from 80,000 to 16,000 entries/s by 2M rows). Sequence numbers
//! are recent for the workloads being charged now. Every key names its UID
//! ([`Entry::validate`](super::entry::Entry::validate)), so the key is as
//! unique as before.
//!
//! Each backend applies, in one transaction, every migration above the recorded
//! version and records each one; an existing version-1 ledger is upgraded in place.
//!
//! `append` is idempotent and atomic: all entries of a call go in one transaction,
//! their workloads numbered first, then `INSERT .. ON CONFLICT DO NOTHING`; a key already present with the same content
//! (ignoring `created_at`) counts as a duplicate, with different content it fails
//! the whole call naming the key.
//!
//! Layout: this file owns the trait, the shared types, `for_each_entry`, `verify`,
//! the URL-chosen [`Store`] and `redact_url`; `schema` the SQL text and migrations,
//! `row` the checks of a read row, `sqlite` and `postgres` the two backends.

mod postgres;
mod row;
mod schema;
mod sqlite;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};

use super::entry::{Balances, Entry, EntryKind, ReservationTotals, format_micros};

pub use postgres::PostgresStore;
pub use schema::{Dialect, SCHEMA_VERSION, schema_up_to};
pub use sqlite::SqliteStore;

/// Rows fetched per round trip when streaming entries.
pub const PAGE: usize = 2000;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "ledger store {0:?} is not understood: use sqlite:PATH (a file) or postgres://USER@HOST:PORT/DB"
    )]
    BadUrl(String),
    #[error("cannot open the SQLite ledger {path}: {source}")]
    SqliteOpen {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("cannot reach PostgreSQL at {url}: {source}")]
    Unreachable {
        url: String,
        source: tokio_postgres::Error,
    },
    #[error(
        "the ledger schema is version {found}, newer than this kaccel supports ({supported}): run a newer kaccel"
    )]
    SchemaTooNew { found: i64, supported: i64 },
    #[error("corrupted ledger row id {id}: column {column}: {detail}")]
    CorruptRow {
        id: i64,
        column: &'static str,
        detail: String,
    },
    #[error(
        "idempotency key {key:?} already holds a different entry; nothing of this batch was written (stored: {stored}; new: {new})"
    )]
    KeyConflict {
        key: String,
        stored: String,
        new: String,
    },
    #[error("refusing ledger entry {key:?}: {reason}")]
    InvalidEntry { key: String, reason: String },
    #[error(
        "the {kind} credits of budget {budget} no longer fit the SQLite ledger's 64-bit total (9.2 million million credits); nothing of this batch was written: start a new ledger file for the budget, or use PostgreSQL"
    )]
    TotalOverflow { budget: String, kind: &'static str },
    #[error("SQLite ledger error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("PostgreSQL ledger error: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("ledger worker thread failed: {0}")]
    Join(String),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppendOutcome {
    pub inserted: usize,
    pub duplicates: usize,
}

/// Which entries to stream: interval start in `[from, to)`, optionally one team.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EntryFilter {
    pub from: Option<i64>,
    pub to: Option<i64>,
    pub team: Option<String>,
    /// Only entries naming this device (UUID) among those their admission held.
    pub device: Option<String>,
    /// Only entries of these kinds (`None`: every kind). The store leaves the
    /// others out of what it reads, so a FOCUS export (charges only) does not
    /// fetch and decode the reservations it would skip.
    pub kinds: Option<Vec<EntryKind>>,
}

impl EntryFilter {
    /// The kinds condition in SQL, the same on both stores. The kinds are the
    /// enum's own names, written as literals: nothing a user typed.
    pub(super) fn kinds_sql(&self) -> String {
        match self.kinds.as_deref() {
            None => "TRUE".to_string(),
            Some([]) => "FALSE".to_string(),
            Some(kinds) => {
                let listed: Vec<String> =
                    kinds.iter().map(|k| format!("'{}'", k.as_str())).collect();
                format!("kind IN ({})", listed.join(", "))
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEntry {
    pub id: i64,
    pub entry: Entry,
}

/// A reservation line (one flavor and resource of an admission) with no Void:
/// its first Reserve entry, what its terms reserve and what its Posts add up to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenReservation {
    /// The line's first Reserve entry (the admission's first term).
    pub reserve: StoredEntry,
    /// Sum of the credits of the line's Reserve entries (every term).
    pub reserved: i128,
    /// The latest `end` of the line's Reserve entries: how far it is reserved.
    pub reserved_until: i64,
    /// Sum of the credits of the line's Post entries (0 without posts).
    pub posted: i128,
    /// The latest `end` of its Post entries, or the Reserve's `start` without posts.
    pub posted_until: i64,
}

impl OpenReservation {
    /// One term's row, before [`merge_open_lines`].
    ///
    /// [`merge_open_lines`]: row::merge_open_lines
    fn from_row(reserve: StoredEntry, posted: i128, posted_until: i64) -> Self {
        OpenReservation {
            reserved: i128::from(reserve.entry.credits),
            reserved_until: reserve.entry.end,
            reserve,
            posted,
            posted_until,
        }
    }

    /// Credits still reserved and not posted.
    pub fn open(&self) -> i128 {
        self.reserved - self.posted
    }
}

/// Sums of `credits` per budget and kind.
pub type KindSums = BTreeMap<String, BTreeMap<EntryKind, i128>>;

pub trait LedgerStore: Send + Sync {
    /// Appends entries atomically and idempotently.
    fn append(
        &self,
        entries: &[Entry],
    ) -> impl Future<Output = Result<AppendOutcome, StoreError>> + Send;
    /// Sums of credits per budget and kind (one aggregate query).
    fn kind_sums(
        &self,
        budget: Option<&str>,
    ) -> impl Future<Output = Result<KindSums, StoreError>> + Send;
    /// The schema version in force.
    fn schema_version(&self) -> impl Future<Output = Result<i64, StoreError>> + Send;
    /// Every entry of a workload (by uid, any budget and admission), in id order.
    fn entries_for_workload(
        &self,
        workload_uid: &str,
    ) -> impl Future<Output = Result<Vec<StoredEntry>, StoreError>> + Send;
    /// The entry holding an idempotency key, if any.
    fn entry_by_key(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<StoredEntry>, StoreError>> + Send;
    /// Every Reserve entry without a Void for the same reservation (budget,
    /// workload uid, admission), in id order, with the sum and the latest end of
    /// its Posts (one aggregate query).
    fn open_reservations(
        &self,
    ) -> impl Future<Output = Result<Vec<OpenReservation>, StoreError>> + Send;
    /// Sum of the credits of a budget's Post and Correction entries whose
    /// interval `end` lies in `[from, to)`.
    fn posted_between(
        &self,
        budget: &str,
        from: i64,
        to: i64,
    ) -> impl Future<Output = Result<i128, StoreError>> + Send;

    /// A reader that fetches and decodes the pages of the entries matching
    /// `filter` (those that exist when it starts) ahead of their consumer, on
    /// a connection of its own: an export or verify of millions of rows keeps
    /// the store, the decoding and the consumer busy at once, and the store's
    /// appends are not held up by it.
    fn page_reader(
        &self,
        filter: &EntryFilter,
    ) -> impl Future<Output = Result<PageReader, StoreError>> + Send;

    /// A budget's balances, from the store's aggregate.
    fn balances(&self, budget: &str) -> impl Future<Output = Result<Balances, StoreError>> + Send {
        async move {
            let sums = self.kind_sums(Some(budget)).await?;
            Ok(sums
                .get(budget)
                .map(Balances::from_sums)
                .unwrap_or_default())
        }
    }
}

/// Pages of entries (up to `PAGE` rows each, in id order) that a task of the
/// store's own reads and decodes while the consumer handles the previous ones;
/// at most [`PageReader::AHEAD`] pages wait and [`SparePages::KEPT`] are kept
/// for reuse, so memory stays flat. Dropping the reader stops its task.
pub struct PageReader {
    pages: tokio::sync::mpsc::Receiver<Result<Vec<StoredEntry>, StoreError>>,
    spare: SparePages,
    task: tokio::task::JoinHandle<()>,
    ended: bool,
}

impl PageReader {
    /// Pages read ahead of the consumer.
    pub const AHEAD: usize = 2;

    /// A reader fed by `read`, which sends each page in order and stops when
    /// the channel is closed; it decodes into the pages the consumer handed
    /// back ([`recycle`](Self::recycle)) where there are any.
    pub fn spawn<F>(read: impl FnOnce(PageSender, SparePages) -> F) -> PageReader
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (tx, pages) = tokio::sync::mpsc::channel(Self::AHEAD);
        let spare = SparePages::default();
        PageReader {
            pages,
            task: tokio::spawn(read(tx, spare.clone())),
            spare,
            ended: false,
        }
    }

    /// The next page; None after the last one. A task that died without
    /// sending its error (a panic) is an error, not the end: an export or a
    /// verify must never stop short silently.
    pub async fn next(&mut self) -> Option<Result<Vec<StoredEntry>, StoreError>> {
        if let Some(page) = self.pages.recv().await {
            return Some(page);
        }
        if std::mem::replace(&mut self.ended, true) {
            return None;
        }
        match (&mut self.task).await {
            Err(e) if e.is_panic() => Some(Err(StoreError::Join(format!(
                "the page reader stopped: {e}"
            )))),
            _ => None,
        }
    }

    /// Hands a page the consumer is done with back to the reader, which
    /// decodes a later page over it: 10M rows then cost no allocation per
    /// text column (12 a row), nor a free on another thread than the one
    /// that allocated it.
    pub fn recycle(&self, page: Vec<StoredEntry>) {
        self.spare.give(page);
    }
}

impl Drop for PageReader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where a [`PageReader`]'s task sends its pages.
pub type PageSender = tokio::sync::mpsc::Sender<Result<Vec<StoredEntry>, StoreError>>;

/// Pages handed back by a [`PageReader`]'s consumer, for its task to decode
/// into; at most [`SparePages::KEPT`], so memory stays that of the pages in
/// flight.
#[derive(Clone, Default)]
pub struct SparePages(std::sync::Arc<std::sync::Mutex<Vec<Vec<StoredEntry>>>>);

impl SparePages {
    /// Enough for every page a reader has in flight and ahead.
    pub const KEPT: usize = 8;

    /// A page to decode into: a spare one, or a new one.
    pub fn take(&self) -> Vec<StoredEntry> {
        self.lock().pop().unwrap_or_default()
    }

    fn give(&self, page: Vec<StoredEntry>) {
        let mut spare = self.lock();
        if spare.len() < Self::KEPT {
            spare.push(page);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<StoredEntry>>> {
        // A panic while holding it cannot leave the list inconsistent.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Streams the entries matching `filter` in id order, `PAGE` rows at a time:
/// memory does not grow with the number of entries.
pub async fn for_each_entry<S: LedgerStore, E: From<StoreError>>(
    store: &S,
    filter: &EntryFilter,
    mut f: impl FnMut(&StoredEntry) -> Result<(), E>,
) -> Result<u64, E> {
    let mut n = 0u64;
    let mut reader = store.page_reader(filter).await?;
    while let Some(page) = reader.next().await {
        let page = page?;
        for e in &page {
            if filter
                .device
                .as_ref()
                .is_some_and(|d| !e.entry.devices.contains(d))
            {
                continue;
            }
            f(e)?;
            n += 1;
        }
        reader.recycle(page);
    }
    Ok(n)
}

/// What `verify` found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    pub entries: u64,
    pub reservations: u64,
    pub open_reservations: u64,
    pub budgets: BTreeMap<String, Balances>,
    pub problems: Vec<String>,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Recomputes every balance by folding all entries and compares it with the
/// store's aggregate; checks every reservation line (at least one Reserve, one
/// per term by key, at most one Void, posts + void ≤ reserves, no post or void
/// without a reserve) and every
/// entry's own rules (key derivation, signs).
pub async fn verify<S: LedgerStore>(store: &S) -> Result<VerifyReport, StoreError> {
    let mut report = VerifyReport::default();
    let mut folded: BTreeMap<String, Balances> = BTreeMap::new();
    // 1M lines at 10M entries, each looked up by a 100-byte key: a hash map
    // (a B-tree compared ~20 keys per entry) from the key to the line's place
    // in `totals`, so the table's slots are small (its growth copies them;
    // totals and keys in the slots took 415 MB at 10M). Reported in key order.
    let mut line_index: std::collections::HashMap<Box<str>, usize, foldhash::fast::RandomState> =
        Default::default();
    let mut totals: Vec<ReservationTotals> = Vec::new();
    let mut line = String::new();
    let mut problems = Vec::new();
    let n = for_each_entry(store, &EntryFilter::default(), |s: &StoredEntry| {
        let e = &s.entry;
        if let Err(reason) = e.validate() {
            problems.push(format!("entry id {} ({}): {reason}", s.id, e.key));
        }
        // Keys are copied only when first seen: 10M entries, 1M lines.
        match folded.get_mut(&e.budget) {
            Some(b) => b.apply(e.kind, e.credits),
            None => {
                let mut b = Balances::default();
                b.apply(e.kind, e.credits);
                folded.insert(e.budget.clone(), b);
            }
        }
        if e.reservation_into(&mut line) {
            let at = match line_index.get(line.as_str()) {
                Some(&at) => at,
                None => {
                    let at = totals.len();
                    line_index.insert(line.as_str().into(), at);
                    totals.push(ReservationTotals {
                        first_id: s.id,
                        ..Default::default()
                    });
                    at
                }
            };
            let t = &mut totals[at];
            let c = i128::from(e.credits);
            match e.kind {
                EntryKind::Reserve => {
                    t.reserved += c;
                    t.reserves += 1;
                }
                EntryKind::Post => t.posted += c,
                EntryKind::Void => {
                    t.voided += c;
                    t.voids += 1;
                }
                _ => {}
            }
        }
        Ok::<(), StoreError>(())
    })
    .await?;
    report.entries = n;
    let mut lines: Vec<(&str, usize)> = line_index.iter().map(|(k, &at)| (&**k, at)).collect();
    lines.sort_unstable_by_key(|(key, _)| *key);
    for (key, at) in lines {
        let t = &totals[at];
        report.reservations += 1;
        if t.reserves == 0 {
            problems.push(format!(
                "reservation {key}: posts or voids (first at id {}) without a Reserve entry",
                t.first_id
            ));
            continue;
        }
        if t.voids > 1 {
            problems.push(format!("reservation {key}: {} Void entries", t.voids));
        }
        if t.posted + t.voided > t.reserved {
            problems.push(format!(
                "reservation {key}: posted {} + voided {} exceed reserved {} credits",
                format_micros(t.posted),
                format_micros(t.voided),
                format_micros(t.reserved)
            ));
        }
        if t.open() > 0 {
            report.open_reservations += 1;
        }
    }
    let sums = store.kind_sums(None).await?;
    let mut names: Vec<&String> = folded.keys().chain(sums.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        let f = folded.get(name).copied().unwrap_or_default();
        let s = sums.get(name).map(Balances::from_sums).unwrap_or_default();
        if f != s {
            problems.push(format!(
                "budget {name}: entries add up to granted {} reserved {} spent {}, the store's totals say granted {} reserved {} spent {}",
                format_micros(f.granted),
                format_micros(f.reserved),
                format_micros(f.spent),
                format_micros(s.granted),
                format_micros(s.reserved),
                format_micros(s.spent)
            ));
        }
        report.budgets.insert(name.clone(), f);
    }
    report.problems = problems;
    Ok(report)
}

fn now_unix() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// Any store, chosen at run time from a URL.
pub enum Store {
    Sqlite(SqliteStore),
    Postgres(Box<PostgresStore>),
}

impl Store {
    /// `sqlite:PATH` or `postgres://…` / `postgresql://…`.
    pub async fn open(url: &str) -> Result<Store, StoreError> {
        if let Some(path) = url.strip_prefix("sqlite:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(StoreError::BadUrl(url.into()));
            }
            Ok(Store::Sqlite(SqliteStore::open(Path::new(path)).await?))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Store::Postgres(Box::new(
                PostgresStore::connect(url).await?,
            )))
        } else {
            Err(StoreError::BadUrl(redact_url(url)))
        }
    }
}

impl LedgerStore for Store {
    async fn append(&self, entries: &[Entry]) -> Result<AppendOutcome, StoreError> {
        match self {
            Store::Sqlite(s) => s.append(entries).await,
            Store::Postgres(s) => s.append(entries).await,
        }
    }
    async fn kind_sums(&self, budget: Option<&str>) -> Result<KindSums, StoreError> {
        match self {
            Store::Sqlite(s) => s.kind_sums(budget).await,
            Store::Postgres(s) => s.kind_sums(budget).await,
        }
    }
    async fn page_reader(&self, filter: &EntryFilter) -> Result<PageReader, StoreError> {
        match self {
            Store::Sqlite(s) => s.page_reader(filter).await,
            Store::Postgres(s) => s.page_reader(filter).await,
        }
    }
    async fn schema_version(&self) -> Result<i64, StoreError> {
        match self {
            Store::Sqlite(s) => s.schema_version().await,
            Store::Postgres(s) => s.schema_version().await,
        }
    }
    async fn entries_for_workload(
        &self,
        workload_uid: &str,
    ) -> Result<Vec<StoredEntry>, StoreError> {
        match self {
            Store::Sqlite(s) => s.entries_for_workload(workload_uid).await,
            Store::Postgres(s) => s.entries_for_workload(workload_uid).await,
        }
    }
    async fn entry_by_key(&self, key: &str) -> Result<Option<StoredEntry>, StoreError> {
        match self {
            Store::Sqlite(s) => s.entry_by_key(key).await,
            Store::Postgres(s) => s.entry_by_key(key).await,
        }
    }
    async fn open_reservations(&self) -> Result<Vec<OpenReservation>, StoreError> {
        match self {
            Store::Sqlite(s) => s.open_reservations().await,
            Store::Postgres(s) => s.open_reservations().await,
        }
    }
    async fn posted_between(&self, budget: &str, from: i64, to: i64) -> Result<i128, StoreError> {
        match self {
            Store::Sqlite(s) => s.posted_between(budget, from, to).await,
            Store::Postgres(s) => s.posted_between(budget, from, to).await,
        }
    }
}

/// A connection URL without its password (`postgres://u:***@h/db`, `password=***`).
pub fn redact_url(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let (authority, tail) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if let Some((userinfo, host)) = authority.rsplit_once('@')
            && let Some((user, _)) = userinfo.split_once(':')
        {
            return format!("{scheme}://{user}:***@{host}{}", redact_query(tail));
        }
        return format!("{scheme}://{authority}{}", redact_query(tail));
    }
    redact_query(url)
}

fn redact_query(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("password=") {
        out.push_str(&rest[..i + "password=".len()]);
        out.push_str("***");
        rest = &rest[i + "password=".len()..];
        let end = rest.find(['&', ' ']).unwrap_or(rest.len());
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_page_reader_that_dies_is_an_error_not_the_end() {
        let mut reader = PageReader::spawn(|pages, _spare| async move {
            let _ = pages.send(Ok(Vec::new())).await;
            panic!("decoding failed");
        });
        assert!(matches!(reader.next().await, Some(Ok(page)) if page.is_empty()));
        let err = reader.next().await.expect("an error, not the end");
        assert!(
            matches!(&err, Err(StoreError::Join(m)) if m.contains("page reader stopped")),
            "{err:?}"
        );
        assert!(reader.next().await.is_none());
        // One that finishes ends the stream.
        let mut reader = PageReader::spawn(|pages, _spare| async move {
            let _ = pages.send(Ok(Vec::new())).await;
        });
        assert!(reader.next().await.is_some_and(|p| p.is_ok()));
        assert!(reader.next().await.is_none());
    }

    #[test]
    fn spare_pages_are_kept_up_to_their_bound_and_handed_out_again() {
        let spare = SparePages::default();
        for _ in 0..SparePages::KEPT + 3 {
            spare.give(Vec::with_capacity(7));
        }
        for _ in 0..SparePages::KEPT {
            assert_eq!(spare.take().capacity(), 7);
        }
        assert_eq!(spare.take().capacity(), 0, "none left: a new page");
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://kaccel:s3cret@db:5432/ledger"),
            "postgres://kaccel:***@db:5432/ledger"
        );
        assert_eq!(
            redact_url("postgres://kaccel@db/ledger?password=x&sslmode=disable"),
            "postgres://kaccel@db/ledger?password=***&sslmode=disable"
        );
        assert_eq!(
            redact_url("host=db password=x user=k"),
            "host=db password=*** user=k"
        );
    }
}
