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
//!
//! Each backend applies, in one transaction, every migration above the recorded
//! version and records each one; an existing version-1 ledger is upgraded in place.
//!
//! `append` is idempotent and atomic: all entries of a call go in one transaction,
//! `INSERT .. ON CONFLICT DO NOTHING`; a key already present with the same content
//! (ignoring `created_at`) counts as a duplicate, with different content it fails
//! the whole call naming the key.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::entry::{Balances, Entry, EntryKind, ReservationTotals, format_micros, line_key};

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = 3;

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
    /// Up to `limit` entries with id > `after_id`, in id order.
    fn entries_page(
        &self,
        filter: &EntryFilter,
        after_id: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StoredEntry>, StoreError>> + Send;
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

/// Streams the entries matching `filter` in id order, `PAGE` rows at a time:
/// memory does not grow with the number of entries.
pub async fn for_each_entry<S: LedgerStore, E: From<StoreError>>(
    store: &S,
    filter: &EntryFilter,
    mut f: impl FnMut(&StoredEntry) -> Result<(), E>,
) -> Result<u64, E> {
    let mut after = 0i64;
    let mut n = 0u64;
    loop {
        let page = store.entries_page(filter, after, PAGE).await?;
        for e in &page {
            f(e)?;
            n += 1;
        }
        match page.last() {
            Some(last) if page.len() == PAGE => after = last.id,
            _ => return Ok(n),
        }
    }
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
    let mut reservations: BTreeMap<String, ReservationTotals> = BTreeMap::new();
    let mut problems = Vec::new();
    let n = for_each_entry(store, &EntryFilter::default(), |s: &StoredEntry| {
        let e = &s.entry;
        if let Err(reason) = e.validate() {
            problems.push(format!("entry id {} ({}): {reason}", s.id, e.key));
        }
        folded
            .entry(e.budget.clone())
            .or_default()
            .apply(e.kind, e.credits);
        if let Some(r) = e.reservation() {
            let t = reservations.entry(r).or_insert_with(|| ReservationTotals {
                first_id: s.id,
                ..Default::default()
            });
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
    for (key, t) in &reservations {
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

const COLUMNS: &str = "idempotency_key, kind, budget, team, workload_namespace, workload_name, workload_uid, admission, class, flavor, resource, device_units, interval_start, interval_end, credits, rate_card, reason, created_at, rate";

fn migration_1(id_column: &str) -> String {
    format!(
        "CREATE TABLE entries (
            id {id_column},
            idempotency_key TEXT NOT NULL UNIQUE,
            kind TEXT NOT NULL,
            budget TEXT NOT NULL,
            team TEXT NOT NULL,
            workload_namespace TEXT NOT NULL,
            workload_name TEXT NOT NULL,
            workload_uid TEXT NOT NULL,
            admission BIGINT NOT NULL,
            class TEXT NOT NULL,
            flavor TEXT NOT NULL,
            resource TEXT NOT NULL,
            device_units BIGINT NOT NULL,
            interval_start BIGINT NOT NULL,
            interval_end BIGINT NOT NULL,
            credits BIGINT NOT NULL,
            rate_card TEXT NOT NULL,
            reason TEXT NOT NULL,
            created_at BIGINT NOT NULL
        );
        CREATE INDEX entries_budget_created ON entries (budget, created_at);
        CREATE INDEX entries_interval_start ON entries (interval_start);"
    )
}

const MIGRATION_2: &str =
    "CREATE INDEX entries_workload_uid ON entries (workload_uid, admission, kind);
    CREATE INDEX entries_budget_kind ON entries (budget, kind, interval_end);
    CREATE INDEX entries_reserves ON entries (id) WHERE kind = 'Reserve';";

const MIGRATION_3: &str = "ALTER TABLE entries ADD COLUMN rate BIGINT NOT NULL DEFAULT 0;";

/// The DDL that takes the schema from `version - 1` to `version`.
fn migration(version: i64, id_column: &str) -> String {
    match version {
        1 => migration_1(id_column),
        2 => MIGRATION_2.to_string(),
        3 => MIGRATION_3.to_string(),
        _ => unreachable!("no migration {version} (SCHEMA_VERSION is {SCHEMA_VERSION})"),
    }
}

/// [`COLUMNS`] qualified with a table alias (`r.idempotency_key, r.kind, …`).
fn columns_of(alias: &str) -> String {
    COLUMNS
        .split(", ")
        .map(|c| format!("{alias}.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The query of [`LedgerStore::open_reservations`], shared by both backends:
/// one row per Reserve entry (a line's term) whose line has no Void; columns
/// 0..=19 are the Reserve's `id` and [`COLUMNS`] (read by `read_row`), 20 the
/// line's posted sum (`sum`, as the backend wants it), 21 its latest post end,
/// 22 and 23 (`check`) the first post id with a corrupt `credits`, resp.
/// `interval_end`, or NULL. Posts and the void are found through the
/// (workload_uid, admission, kind) index, Reserves through their partial index;
/// [`merge_open_lines`] folds a line's terms into one [`OpenReservation`].
fn open_reservations_sql(sum: &str, check: &str) -> String {
    let cols = columns_of("r");
    let same_line = |x: &str| {
        format!(
            "{x}.workload_uid = r.workload_uid AND {x}.admission = r.admission AND {x}.budget = r.budget \
             AND {x}.flavor = r.flavor AND {x}.resource = r.resource"
        )
    };
    format!(
        "SELECT r.id, {cols}, {sum}, COALESCE(MAX(p.interval_end), r.interval_start), {check}
         FROM entries r
         LEFT JOIN entries p ON {} AND p.kind = 'Post'
         WHERE r.kind = 'Reserve' AND NOT EXISTS (
             SELECT 1 FROM entries v WHERE {} AND v.kind = 'Void')
         GROUP BY r.id
         ORDER BY r.id",
        same_line("p"),
        same_line("v")
    )
}

/// Folds the rows of [`open_reservations_sql`] (one per term, each with the
/// line's posts) into one open reservation per line, in the order of the line's
/// first Reserve.
fn merge_open_lines(rows: Vec<OpenReservation>) -> Vec<OpenReservation> {
    let mut out: Vec<OpenReservation> = Vec::with_capacity(rows.len());
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    for row in rows {
        let line = line_key(&row.reserve.entry.line());
        match index.get(&line) {
            Some(&i) => {
                let first = &mut out[i];
                first.reserved += row.reserved;
                first.reserved_until = first.reserved_until.max(row.reserved_until);
            }
            None => {
                index.insert(line, out.len());
                out.push(row);
            }
        }
    }
    out
}

/// The error for an aggregated row (a post of an open reservation, an entry of
/// `posted_between`) that the backend's check found corrupt.
fn corrupt_aggregated(id: i64, column: &'static str, within: &str) -> StoreError {
    let detail = match column {
        "credits" => format!("not a non-negative integer amount ({within})"),
        _ => format!("not an integer ({within})"),
    };
    StoreError::CorruptRow { id, column, detail }
}

/// Raw column values of a row, before checking (shared by both backends).
struct RawRow {
    id: i64,
    key: String,
    kind: String,
    budget: String,
    team: String,
    namespace: String,
    workload: String,
    uid: String,
    admission: i64,
    class: String,
    flavor: String,
    resource: String,
    units: i64,
    start: i64,
    end: i64,
    credits: i64,
    rate_card: String,
    reason: String,
    created_at: i64,
    rate: i64,
}

impl RawRow {
    /// `id` then [`COLUMNS`] in order, through each backend's typed getters
    /// (which name the column when a row is corrupt).
    fn read(
        id: i64,
        text: impl Fn(usize, &'static str) -> Result<String, StoreError>,
        int: impl Fn(usize, &'static str) -> Result<i64, StoreError>,
    ) -> Result<RawRow, StoreError> {
        Ok(RawRow {
            id,
            key: text(1, "idempotency_key")?,
            kind: text(2, "kind")?,
            budget: text(3, "budget")?,
            team: text(4, "team")?,
            namespace: text(5, "workload_namespace")?,
            workload: text(6, "workload_name")?,
            uid: text(7, "workload_uid")?,
            admission: int(8, "admission")?,
            class: text(9, "class")?,
            flavor: text(10, "flavor")?,
            resource: text(11, "resource")?,
            units: int(12, "device_units")?,
            start: int(13, "interval_start")?,
            end: int(14, "interval_end")?,
            credits: int(15, "credits")?,
            rate_card: text(16, "rate_card")?,
            reason: text(17, "reason")?,
            created_at: int(18, "created_at")?,
            rate: int(19, "rate")?,
        })
    }

    fn into_entry(self) -> Result<StoredEntry, StoreError> {
        let id = self.id;
        let corrupt = |column, detail: String| StoreError::CorruptRow { id, column, detail };
        let kind: EntryKind = self
            .kind
            .parse()
            .map_err(|_| corrupt("kind", format!("{:?} is not an entry kind", self.kind)))?;
        let admission = u32::try_from(self.admission).map_err(|_| {
            corrupt(
                "admission",
                format!("{} is not an admission number", self.admission),
            )
        })?;
        let device_units = u64::try_from(self.units)
            .map_err(|_| corrupt("device_units", format!("{} is negative", self.units)))?;
        if self.credits < 0 && kind != EntryKind::Correction {
            return Err(corrupt(
                "credits",
                format!("{} is negative on a {kind} entry", self.credits),
            ));
        }
        if self.key.is_empty() {
            return Err(corrupt("idempotency_key", "empty".into()));
        }
        let rate = u64::try_from(self.rate)
            .map_err(|_| corrupt("rate", format!("{} is negative", self.rate)))?;
        Ok(StoredEntry {
            id,
            entry: Entry {
                key: self.key,
                kind,
                budget: self.budget,
                team: self.team,
                namespace: self.namespace,
                workload: self.workload,
                workload_uid: self.uid,
                admission,
                class: self.class,
                flavor: self.flavor,
                resource: self.resource,
                device_units,
                start: self.start,
                end: self.end,
                credits: self.credits,
                rate_card: self.rate_card,
                reason: self.reason,
                created_at: self.created_at,
                rate,
            },
        })
    }
}

fn check(e: &Entry) -> Result<(), StoreError> {
    e.validate().map_err(|reason| StoreError::InvalidEntry {
        key: e.key.clone(),
        reason,
    })
}

fn conflict(stored: &Entry, new: &Entry) -> StoreError {
    StoreError::KeyConflict {
        key: new.key.clone(),
        stored: serde_json::to_string(stored).unwrap_or_default(),
        new: serde_json::to_string(new).unwrap_or_default(),
    }
}

fn now_unix() -> i64 {
    jiff::Timestamp::now().as_second()
}

/// Any store, chosen at run time from a URL.
pub enum Store {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
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
            Ok(Store::Postgres(PostgresStore::connect(url).await?))
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
    async fn entries_page(
        &self,
        filter: &EntryFilter,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<StoredEntry>, StoreError> {
        match self {
            Store::Sqlite(s) => s.entries_page(filter, after_id, limit).await,
            Store::Postgres(s) => s.entries_page(filter, after_id, limit).await,
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

// ---------------------------------------------------------------- SQLite

/// The embedded store: one SQLite file in WAL mode with `synchronous=FULL`, so an
/// append that returned is on disk. Calls run on tokio's blocking pool.
#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<rusqlite::Connection>>,
    path: PathBuf,
}

impl SqliteStore {
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        let path = path.to_path_buf();
        let p = path.clone();
        let conn = tokio::task::spawn_blocking(move || Self::open_blocking(&p))
            .await
            .map_err(|e| StoreError::Join(e.to_string()))??;
        Ok(SqliteStore {
            conn: Arc::new(Mutex::new(conn)),
            path,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open_blocking(path: &Path) -> Result<rusqlite::Connection, StoreError> {
        let open_err = |source| StoreError::SqliteOpen {
            path: path.to_path_buf(),
            source,
        };
        let mut conn = rusqlite::Connection::open(path).map_err(open_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(open_err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(open_err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(open_err)?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(open_err)?;
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)",
        )?;
        let found: i64 = tx.query_row(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            [],
            |r| r.get(0),
        )?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                found,
                supported: SCHEMA_VERSION,
            });
        }
        for version in (found + 1)..=SCHEMA_VERSION {
            tx.execute_batch(&migration(version, "INTEGER PRIMARY KEY AUTOINCREMENT"))?;
            tx.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
                [version, now_unix()],
            )?;
        }
        tx.commit()?;
        Ok(conn)
    }

    async fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = conn
                .lock()
                .map_err(|_| StoreError::Join("SQLite connection lock poisoned".into()))?;
            f(&mut guard)
        })
        .await
        .map_err(|e| StoreError::Join(e.to_string()))?
    }

    fn read_row(r: &rusqlite::Row<'_>) -> Result<StoredEntry, StoreError> {
        let id: i64 = r.get(0)?;
        let text = |i: usize, column: &'static str| -> Result<String, StoreError> {
            match r.get_ref(i)? {
                rusqlite::types::ValueRef::Text(t) => {
                    String::from_utf8(t.to_vec()).map_err(|_| StoreError::CorruptRow {
                        id,
                        column,
                        detail: "not UTF-8 text".into(),
                    })
                }
                other => Err(StoreError::CorruptRow {
                    id,
                    column,
                    detail: format!("expected text, found {:?}", other.data_type()),
                }),
            }
        };
        let int = |i: usize, column: &'static str| -> Result<i64, StoreError> {
            match r.get_ref(i)? {
                rusqlite::types::ValueRef::Integer(v) => Ok(v),
                other => Err(StoreError::CorruptRow {
                    id,
                    column,
                    detail: format!("expected an integer, found {:?}", other.data_type()),
                }),
            }
        };
        RawRow::read(id, text, int)?.into_entry()
    }
}

impl LedgerStore for SqliteStore {
    async fn append(&self, entries: &[Entry]) -> Result<AppendOutcome, StoreError> {
        for e in entries {
            check(e)?;
        }
        let entries = entries.to_vec();
        self.with_conn(move |conn| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let mut out = AppendOutcome::default();
            {
                let mut insert = tx.prepare_cached(&format!(
                    "INSERT INTO entries ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19) ON CONFLICT (idempotency_key) DO NOTHING"
                ))?;
                let mut existing = tx.prepare_cached(&format!(
                    "SELECT id, {COLUMNS} FROM entries WHERE idempotency_key = ?1"
                ))?;
                for e in &entries {
                    let n = insert.execute(rusqlite::params![
                        e.key,
                        e.kind.as_str(),
                        e.budget,
                        e.team,
                        e.namespace,
                        e.workload,
                        e.workload_uid,
                        i64::from(e.admission),
                        e.class,
                        e.flavor,
                        e.resource,
                        e.device_units as i64,
                        e.start,
                        e.end,
                        e.credits,
                        e.rate_card,
                        e.reason,
                        e.created_at,
                        e.rate as i64,
                    ])?;
                    if n == 1 {
                        out.inserted += 1;
                        continue;
                    }
                    let stored = {
                        let mut rows = existing.query([&e.key])?;
                        let row = rows.next()?.ok_or_else(|| StoreError::InvalidEntry {
                            key: e.key.clone(),
                            reason: "insert conflicted but no row holds the key".into(),
                        })?;
                        Self::read_row(row)?
                    };
                    if !stored.entry.same_content(e) {
                        return Err(conflict(&stored.entry, e));
                    }
                    out.duplicates += 1;
                }
            }
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    async fn kind_sums(&self, budget: Option<&str>) -> Result<KindSums, StoreError> {
        let budget = budget.map(str::to_string);
        self.with_conn(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT budget, kind, SUM(credits), MIN(id) FROM entries WHERE (?1 IS NULL OR budget = ?1) GROUP BY budget, kind",
            )?;
            let mut rows = stmt.query([budget])?;
            let mut out = KindSums::new();
            while let Some(r) = rows.next()? {
                let b: String = r.get(0)?;
                let k: String = r.get(1)?;
                let sum: i64 = r.get(2)?;
                // A row of the group, so a bad kind is reported with a real row id.
                let first_id: i64 = r.get(3)?;
                let kind = k.parse().map_err(|_| StoreError::CorruptRow {
                    id: first_id,
                    column: "kind",
                    detail: format!("{k:?} is not an entry kind (budget {b})"),
                })?;
                out.entry(b).or_default().insert(kind, i128::from(sum));
            }
            Ok(out)
        })
        .await
    }

    async fn entries_page(
        &self,
        filter: &EntryFilter,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<StoredEntry>, StoreError> {
        let filter = filter.clone();
        self.with_conn(move |conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT id, {COLUMNS} FROM entries WHERE id > ?1 AND (?2 IS NULL OR interval_start >= ?2) AND (?3 IS NULL OR interval_start < ?3) AND (?4 IS NULL OR team = ?4) ORDER BY id LIMIT ?5"
            ))?;
            let mut rows = stmt.query(rusqlite::params![
                after_id,
                filter.from,
                filter.to,
                filter.team,
                limit as i64
            ])?;
            let mut out = Vec::with_capacity(limit.min(PAGE));
            while let Some(r) = rows.next()? {
                out.push(Self::read_row(r)?);
            }
            Ok(out)
        })
        .await
    }

    async fn schema_version(&self) -> Result<i64, StoreError> {
        self.with_conn(|conn| {
            Ok(conn.query_row(
                "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
                [],
                |r| r.get(0),
            )?)
        })
        .await
    }

    async fn entries_for_workload(
        &self,
        workload_uid: &str,
    ) -> Result<Vec<StoredEntry>, StoreError> {
        let uid = workload_uid.to_string();
        self.with_conn(move |conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT id, {COLUMNS} FROM entries WHERE workload_uid = ?1 ORDER BY id"
            ))?;
            let mut rows = stmt.query([uid])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                out.push(Self::read_row(r)?);
            }
            Ok(out)
        })
        .await
    }

    async fn entry_by_key(&self, key: &str) -> Result<Option<StoredEntry>, StoreError> {
        let key = key.to_string();
        self.with_conn(move |conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT id, {COLUMNS} FROM entries WHERE idempotency_key = ?1"
            ))?;
            let mut rows = stmt.query([key])?;
            rows.next()?.map(Self::read_row).transpose()
        })
        .await
    }

    async fn open_reservations(&self) -> Result<Vec<OpenReservation>, StoreError> {
        self.with_conn(move |conn| {
            let mut stmt = conn.prepare_cached(&open_reservations_sql(
                "SUM(p.credits)",
                "MIN(CASE WHEN typeof(p.credits) <> 'integer' OR p.credits < 0 THEN p.id END), \
                 MIN(CASE WHEN typeof(p.interval_end) <> 'integer' THEN p.id END)",
            ))?;
            let mut rows = stmt.query([])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                let reserve = Self::read_row(r)?;
                let within = || format!("a post of reservation {}", reserve.entry.key);
                if let Some(id) = r.get::<_, Option<i64>>(22)? {
                    return Err(corrupt_aggregated(id, "credits", &within()));
                }
                if let Some(id) = r.get::<_, Option<i64>>(23)? {
                    return Err(corrupt_aggregated(id, "interval_end", &within()));
                }
                let posted: Option<i64> = r.get(20)?;
                let posted_until: i64 = r.get(21)?;
                out.push(OpenReservation::from_row(
                    reserve,
                    i128::from(posted.unwrap_or(0)),
                    posted_until,
                ));
            }
            Ok(merge_open_lines(out))
        })
        .await
    }

    async fn posted_between(&self, budget: &str, from: i64, to: i64) -> Result<i128, StoreError> {
        let budget = budget.to_string();
        self.with_conn(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT SUM(credits), MIN(CASE WHEN typeof(credits) <> 'integer' OR (kind = 'Post' AND credits < 0) THEN id END) \
                 FROM entries WHERE budget = ?1 AND kind IN ('Post', 'Correction') AND interval_end >= ?2 AND interval_end < ?3",
            )?;
            // The sum is read as any value: a corrupt amount makes it REAL, and
            // the check column names the row.
            let (sum, bad): (rusqlite::types::Value, Option<i64>) =
                stmt.query_row(rusqlite::params![budget, from, to], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?;
            let corrupt = |id| {
                corrupt_aggregated(
                    id,
                    "credits",
                    &format!("posted credits of budget {budget}"),
                )
            };
            if let Some(id) = bad {
                return Err(corrupt(id));
            }
            match sum {
                rusqlite::types::Value::Null => Ok(0),
                rusqlite::types::Value::Integer(v) => Ok(i128::from(v)),
                _ => Err(corrupt(0)),
            }
        })
        .await
    }
}

// ---------------------------------------------------------------- PostgreSQL

/// The production store: PostgreSQL over tokio-postgres (no TLS). A dropped
/// connection is re-established on the next call.
pub struct PostgresStore {
    url: String,
    client: tokio::sync::Mutex<tokio_postgres::Client>,
}

impl PostgresStore {
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let client = Self::dial(url).await?;
        let store = PostgresStore {
            url: url.to_string(),
            client: tokio::sync::Mutex::new(client),
        };
        store.migrate().await?;
        Ok(store)
    }

    async fn dial(url: &str) -> Result<tokio_postgres::Client, StoreError> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .map_err(|source| StoreError::Unreachable {
                url: redact_url(url),
                source,
            })?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "PostgreSQL ledger connection closed");
            }
        });
        Ok(client)
    }

    async fn client(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, tokio_postgres::Client>, StoreError> {
        let mut guard = self.client.lock().await;
        if guard.is_closed() {
            *guard = Self::dial(&self.url).await?;
        }
        Ok(guard)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // Serialise concurrent starters (several replicas, tests in parallel).
        tx.execute("SELECT pg_advisory_xact_lock(7238011)", &[])
            .await?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)",
        )
        .await?;
        let found: i64 = tx
            .query_one(
                "SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_migrations",
                &[],
            )
            .await?
            .get(0);
        if found > SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                found,
                supported: SCHEMA_VERSION,
            });
        }
        for version in (found + 1)..=SCHEMA_VERSION {
            tx.batch_execute(&migration(
                version,
                "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
            ))
            .await?;
            tx.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)",
                &[&version, &now_unix()],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    fn read_row(r: &tokio_postgres::Row) -> Result<StoredEntry, StoreError> {
        let id: i64 = r.try_get(0)?;
        let text = |i: usize, column: &'static str| -> Result<String, StoreError> {
            r.try_get::<_, String>(i)
                .map_err(|e| StoreError::CorruptRow {
                    id,
                    column,
                    detail: e.to_string(),
                })
        };
        let int = |i: usize, column: &'static str| -> Result<i64, StoreError> {
            r.try_get::<_, i64>(i).map_err(|e| StoreError::CorruptRow {
                id,
                column,
                detail: e.to_string(),
            })
        };
        RawRow::read(id, text, int)?.into_entry()
    }
}

impl LedgerStore for PostgresStore {
    async fn append(&self, entries: &[Entry]) -> Result<AppendOutcome, StoreError> {
        for e in entries {
            check(e)?;
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let insert = tx
            .prepare(&format!(
                "INSERT INTO entries ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19) ON CONFLICT (idempotency_key) DO NOTHING"
            ))
            .await?;
        let ints: Vec<[i64; 3]> = entries
            .iter()
            .map(|e| [i64::from(e.admission), e.device_units as i64, e.rate as i64])
            .collect();
        // Pipelined: all inserts are sent without waiting for each reply.
        let results = futures::future::try_join_all(entries.iter().zip(&ints).map(|(e, n)| {
            let kind = e.kind.as_str();
            let insert = &insert;
            let tx = &tx;
            async move {
                tx.execute(
                    insert,
                    &[
                        &e.key,
                        &kind,
                        &e.budget,
                        &e.team,
                        &e.namespace,
                        &e.workload,
                        &e.workload_uid,
                        &n[0],
                        &e.class,
                        &e.flavor,
                        &e.resource,
                        &n[1],
                        &e.start,
                        &e.end,
                        &e.credits,
                        &e.rate_card,
                        &e.reason,
                        &e.created_at,
                        &n[2],
                    ],
                )
                .await
            }
        }))
        .await?;
        let mut out = AppendOutcome::default();
        for (e, n) in entries.iter().zip(results) {
            if n == 1 {
                out.inserted += 1;
                continue;
            }
            let row = tx
                .query_one(
                    &format!("SELECT id, {COLUMNS} FROM entries WHERE idempotency_key = $1"),
                    &[&e.key],
                )
                .await?;
            let stored = Self::read_row(&row)?;
            if !stored.entry.same_content(e) {
                return Err(conflict(&stored.entry, e));
            }
            out.duplicates += 1;
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn kind_sums(&self, budget: Option<&str>) -> Result<KindSums, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT budget, kind, SUM(credits)::TEXT, MIN(id) FROM entries WHERE ($1::TEXT IS NULL OR budget = $1) GROUP BY budget, kind",
                &[&budget],
            )
            .await?;
        let mut out = KindSums::new();
        for r in rows {
            let b: String = r.try_get(0)?;
            let k: String = r.try_get(1)?;
            let sum: String = r.try_get(2)?;
            // A row of the group, so a bad kind is reported with a real row id.
            let first_id: i64 = r.try_get(3)?;
            let kind = k.parse().map_err(|_| StoreError::CorruptRow {
                id: first_id,
                column: "kind",
                detail: format!("{k:?} is not an entry kind (budget {b})"),
            })?;
            let sum: i128 = sum.parse().map_err(|_| StoreError::CorruptRow {
                id: first_id,
                column: "credits",
                detail: format!("sum {sum:?} of budget {b} is not an integer"),
            })?;
            out.entry(b).or_default().insert(kind, sum);
        }
        Ok(out)
    }

    async fn entries_page(
        &self,
        filter: &EntryFilter,
        after_id: i64,
        limit: usize,
    ) -> Result<Vec<StoredEntry>, StoreError> {
        let client = self.client().await?;
        let limit = limit as i64;
        let rows = client
            .query(
                &format!(
                    "SELECT id, {COLUMNS} FROM entries WHERE id > $1 AND ($2::BIGINT IS NULL OR interval_start >= $2) AND ($3::BIGINT IS NULL OR interval_start < $3) AND ($4::TEXT IS NULL OR team = $4) ORDER BY id LIMIT $5"
                ),
                &[&after_id, &filter.from, &filter.to, &filter.team, &limit],
            )
            .await?;
        rows.iter().map(Self::read_row).collect()
    }

    async fn schema_version(&self) -> Result<i64, StoreError> {
        let client = self.client().await?;
        Ok(client
            .query_one(
                "SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_migrations",
                &[],
            )
            .await?
            .get(0))
    }

    async fn entries_for_workload(
        &self,
        workload_uid: &str,
    ) -> Result<Vec<StoredEntry>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!("SELECT id, {COLUMNS} FROM entries WHERE workload_uid = $1 ORDER BY id"),
                &[&workload_uid],
            )
            .await?;
        rows.iter().map(Self::read_row).collect()
    }

    async fn entry_by_key(&self, key: &str) -> Result<Option<StoredEntry>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!("SELECT id, {COLUMNS} FROM entries WHERE idempotency_key = $1"),
                &[&key],
            )
            .await?;
        row.as_ref().map(Self::read_row).transpose()
    }

    async fn open_reservations(&self) -> Result<Vec<OpenReservation>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &open_reservations_sql(
                    "COALESCE(SUM(p.credits), 0)::TEXT",
                    "MIN(CASE WHEN p.credits < 0 THEN p.id END), NULL::BIGINT",
                ),
                &[],
            )
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let reserve = Self::read_row(r)?;
            if let Some(id) = r.try_get::<_, Option<i64>>(22)? {
                return Err(corrupt_aggregated(
                    id,
                    "credits",
                    &format!("a post of reservation {}", reserve.entry.key),
                ));
            }
            let posted: String = r.try_get(20)?;
            let posted: i128 = posted.parse().map_err(|_| StoreError::CorruptRow {
                id: reserve.id,
                column: "credits",
                detail: format!("sum {posted:?} of the posts is not an integer"),
            })?;
            let posted_until: i64 = r.try_get(21)?;
            out.push(OpenReservation::from_row(reserve, posted, posted_until));
        }
        Ok(merge_open_lines(out))
    }

    async fn posted_between(&self, budget: &str, from: i64, to: i64) -> Result<i128, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT COALESCE(SUM(credits), 0)::TEXT, MIN(CASE WHEN kind = 'Post' AND credits < 0 THEN id END) \
                 FROM entries WHERE budget = $1 AND kind IN ('Post', 'Correction') AND interval_end >= $2 AND interval_end < $3",
                &[&budget, &from, &to],
            )
            .await?;
        if let Some(id) = row.try_get::<_, Option<i64>>(1)? {
            return Err(corrupt_aggregated(
                id,
                "credits",
                &format!("posted credits of budget {budget}"),
            ));
        }
        let sum: String = row.try_get(0)?;
        sum.parse().map_err(|_| StoreError::CorruptRow {
            id: 0,
            column: "credits",
            detail: format!("sum {sum:?} of budget {budget} is not an integer"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version-1 SQLite ledger as kaccel 1 wrote it: the v1 DDL, version 1
    /// recorded, rows inserted directly.
    fn v1_file(path: &Path, entries: &[Entry]) {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch(
            "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL);
             INSERT INTO schema_migrations (version, applied_at) VALUES (1, 1767225600);",
        )
        .unwrap();
        conn.execute_batch(&migration_1("INTEGER PRIMARY KEY AUTOINCREMENT"))
            .unwrap();
        for e in entries {
            conn.execute(
                &format!(
                    "INSERT INTO entries ({}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
                    COLUMNS.trim_end_matches(", rate")
                ),
                rusqlite::params![
                    e.key, e.kind.as_str(), e.budget, e.team, e.namespace, e.workload,
                    e.workload_uid, i64::from(e.admission), e.class, e.flavor, e.resource,
                    e.device_units as i64, e.start, e.end, e.credits, e.rate_card, e.reason,
                    e.created_at,
                ],
            )
            .unwrap();
        }
    }

    fn sqlite_indexes(path: &Path) -> Vec<String> {
        let conn = rusqlite::Connection::open(path).unwrap();
        let mut stmt = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'entries' AND sql IS NOT NULL ORDER BY name")
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[tokio::test]
    async fn sqlite_version_1_is_upgraded_in_place() {
        use crate::ledger::conformance::lifecycle;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.db");
        let mut entries = lifecycle("b1", "t", "u1", 2, 3);
        let mut open = lifecycle("b2", "t", "u2", 1, 1);
        open.pop();
        entries.extend(open);
        v1_file(&path, &entries);
        // Version 3 adds the rate; rows written before read it as 0.
        for e in &mut entries {
            e.rate = 0;
        }
        assert_eq!(
            sqlite_indexes(&path),
            ["entries_budget_created", "entries_interval_start"]
        );

        let store = SqliteStore::open(&path).await.unwrap();
        assert_eq!(store.schema_version().await.unwrap(), 3);
        assert_eq!(
            sqlite_indexes(&path),
            [
                "entries_budget_created",
                "entries_budget_kind",
                "entries_interval_start",
                "entries_reserves",
                "entries_workload_uid",
            ]
        );
        // Data intact, ids kept.
        let mut all = Vec::new();
        for_each_entry(&store, &EntryFilter::default(), |s: &StoredEntry| {
            all.push(s.clone());
            Ok::<_, StoreError>(())
        })
        .await
        .unwrap();
        assert_eq!(
            all.iter().map(|s| s.id).collect::<Vec<_>>(),
            (1..=9).collect::<Vec<_>>()
        );
        assert_eq!(
            all.into_iter().map(|s| s.entry).collect::<Vec<_>>(),
            entries
        );
        assert!(verify(&store).await.unwrap().ok());
        let open = store.open_reservations().await.unwrap();
        assert_eq!(open.len(), 1);
        assert_eq!((open[0].reserve.id, open[0].posted), (8, 4_000_000));
        assert_eq!(
            store.posted_between("b1", 0, i64::MAX).await.unwrap(),
            24_000_000
        );
        // New entries get the next ids.
        let more = lifecycle("b3", "t", "u3", 1, 0);
        store.append(&more).await.unwrap();
        assert_eq!(
            store.entry_by_key(&more[0].key).await.unwrap().unwrap().id,
            10
        );
        drop(store);

        // Reopening applies nothing twice.
        let store = SqliteStore::open(&path).await.unwrap();
        assert_eq!(store.schema_version().await.unwrap(), 3);
        let versions: Vec<i64> = store
            .with_conn(|conn| {
                let mut stmt =
                    conn.prepare("SELECT version FROM schema_migrations ORDER BY version")?;
                let v = stmt
                    .query_map([], |r| r.get(0))?
                    .collect::<Result<_, _>>()?;
                Ok(v)
            })
            .await
            .unwrap();
        assert_eq!(versions, [1, 2, 3]);
    }

    /// The admission queries use the migration-2 indexes rather than scanning
    /// the table.
    #[tokio::test]
    async fn sqlite_admission_queries_use_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("l.db")).await.unwrap();
        let plans = store
            .with_conn(|conn| {
                let plan = |sql: &str| -> Result<String, StoreError> {
                    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
                    let rows = stmt
                        .query_map([], |r| r.get::<_, String>(3))?
                        .collect::<Result<Vec<_>, _>>()?;
                    Ok(rows.join("; "))
                };
                Ok([
                    plan(&format!("SELECT id, {COLUMNS} FROM entries WHERE workload_uid = 'u' ORDER BY id"))?,
                    plan(&open_reservations_sql("SUM(p.credits)", "NULL, NULL"))?,
                    plan("SELECT SUM(credits) FROM entries WHERE budget = 'b' AND kind IN ('Post', 'Correction') AND interval_end >= 1 AND interval_end < 2")?,
                ])
            })
            .await
            .unwrap();
        for plan in &plans {
            eprintln!("{plan}");
        }
        assert!(
            plans[0].contains("USING INDEX entries_workload_uid"),
            "{}",
            plans[0]
        );
        assert!(
            plans[1].contains("USING INDEX entries_reserves"),
            "{}",
            plans[1]
        );
        assert!(
            plans[1].contains("SEARCH p USING INDEX entries_workload_uid"),
            "{}",
            plans[1]
        );
        assert!(
            plans[1].contains("SEARCH v USING INDEX entries_workload_uid"),
            "{}",
            plans[1]
        );
        assert!(
            plans[2].contains("USING INDEX entries_budget_kind"),
            "{}",
            plans[2]
        );
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
