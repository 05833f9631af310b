//! The SQLite backend: one embedded file, calls on tokio's blocking pool.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::OptionalExtension;

use super::row::{RawRow, check, conflict, corrupt_aggregated, group_kind, merge_open_lines};
use super::schema::{
    COLUMNS, CONFLICT_TARGET, CREATE_MIGRATIONS_TABLE, Dialect, add_to_totals_sql, migration,
    open_reservations_sql, pending_migrations, totals_of,
};
use super::{
    AppendOutcome, EntryFilter, KindSums, LedgerStore, OpenReservation, PAGE, PageReader,
    PageSender, SparePages, StoreError, StoredEntry, now_unix,
};
use crate::ledger::entry::{Entry, key_workload_uid};

/// Pages of the connection's cache (`cache_size`, in KiB when negative): the
/// upper levels of the indexes and the recent leaves stay in memory, so an
/// append on a large ledger reads few pages from the file.
const CACHE_KIB: i64 = 16 * 1024;

/// The least time between two checkpoints: appends in between share one, so a
/// page written by many of them is copied back once.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// The log is cut back to this size when a checkpoint let it restart.
const LOG_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// A log larger than this gets a RESTART checkpoint, which waits for the
/// writer: under a sustained burst a passive checkpoint never catches up with
/// the last frame, and the log would only grow.
const LOG_RESTART_BYTES: u64 = 256 * 1024 * 1024;

/// The embedded store: one SQLite file in WAL mode with `synchronous=FULL`, so an
/// append that returned is on disk. Calls run on tokio's blocking pool; a
/// thread of its own checkpoints the log (see [`Checkpointer`]).
#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<rusqlite::Connection>>,
    path: PathBuf,
    checkpointer: Arc<Checkpointer>,
}

/// Copies the write-ahead log back into the database from a second connection
/// (`wal_checkpoint(PASSIVE)`: it never blocks the writer), so an append only
/// ever writes the log: a checkpoint of a large log writes and syncs megabytes,
/// which would otherwise land on one admission's latency. Woken by appends, at
/// most once per [`CHECKPOINT_EVERY`]; the thread ends when the last handle of
/// the store is dropped (its sender with it).
struct Checkpointer {
    wake: std::sync::mpsc::SyncSender<()>,
}

impl Checkpointer {
    fn start(path: &Path) -> Result<Checkpointer, StoreError> {
        let conn = SqliteStore::connect(path)?;
        let (wake, woken) = std::sync::mpsc::sync_channel::<()>(1);
        let mut log = path.as_os_str().to_owned();
        log.push("-wal");
        let log = PathBuf::from(log);
        std::thread::Builder::new()
            .name("kaccel-sqlite-checkpoint".into())
            .spawn(move || {
                let mut last = std::time::Instant::now() - CHECKPOINT_EVERY;
                while woken.recv().is_ok() {
                    std::thread::sleep(CHECKPOINT_EVERY.saturating_sub(last.elapsed()));
                    // Appends during the wait are covered by this checkpoint.
                    let _ = woken.try_recv();
                    last = std::time::Instant::now();
                    // A failed checkpoint is retried on the next wake; the log
                    // keeps every committed append meanwhile.
                    let large = std::fs::metadata(&log).is_ok_and(|m| m.len() > LOG_RESTART_BYTES);
                    let mode = if large { "RESTART" } else { "PASSIVE" };
                    if let Err(e) =
                        conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |_| Ok(()))
                    {
                        tracing::warn!(error = %e, "SQLite ledger checkpoint failed; retrying");
                    }
                }
            })
            .map_err(|e| StoreError::Join(format!("cannot start the checkpoint thread: {e}")))?;
        Ok(Checkpointer { wake })
    }

    /// After a commit: the log has new frames to copy back.
    fn appended(&self) {
        // Full means a wake is already pending.
        let _ = self.wake.try_send(());
    }
}

impl SqliteStore {
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        let path = path.to_path_buf();
        let p = path.clone();
        // Both open files, so both run off the async threads.
        let (conn, checkpointer) = tokio::task::spawn_blocking(move || {
            let conn = Self::open_blocking(&p)?;
            Ok::<_, StoreError>((conn, Checkpointer::start(&p)?))
        })
        .await
        .map_err(|e| StoreError::Join(e.to_string()))??;
        Ok(SqliteStore {
            conn: Arc::new(Mutex::new(conn)),
            path,
            checkpointer: Arc::new(checkpointer),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open_err(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        move |source| StoreError::SqliteOpen {
            path: path.to_path_buf(),
            source,
        }
    }

    /// A connection to `path` as every one of the store's is set: waits up to
    /// 10 s for a lock, `synchronous=FULL`.
    fn connect(path: &Path) -> Result<rusqlite::Connection, StoreError> {
        let open_err = Self::open_err(path);
        let conn = rusqlite::Connection::open(path).map_err(&open_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(&open_err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(&open_err)?;
        Ok(conn)
    }

    fn open_blocking(path: &Path) -> Result<rusqlite::Connection, StoreError> {
        let open_err = Self::open_err(path);
        let mut conn = Self::connect(path)?;
        // Set on the file: every later connection uses the log too.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(&open_err)?;
        conn.pragma_update(None, "cache_size", -CACHE_KIB)
            .map_err(&open_err)?;
        // The checkpointer thread copies the log back (see `Checkpointer`).
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(&open_err)?;
        conn.pragma_update(None, "journal_size_limit", LOG_SIZE_LIMIT)
            .map_err(&open_err)?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(&open_err)?;
        tx.execute_batch(CREATE_MIGRATIONS_TABLE)?;
        let found: i64 = tx.query_row(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            [],
            |r| r.get(0),
        )?;
        for version in pending_migrations(found)? {
            tx.execute_batch(&migration(version, Dialect::Sqlite))?;
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

    /// Each entry's workload sequence number (`workload_ids`), numbering the
    /// UIDs the ledger has not seen yet, within the append's transaction.
    fn workload_seqs(
        tx: &rusqlite::Transaction<'_>,
        entries: &[Entry],
    ) -> Result<Vec<i64>, StoreError> {
        let mut lookup = tx.prepare_cached("SELECT seq FROM workload_ids WHERE uid = ?1")?;
        let mut number = tx.prepare_cached("INSERT INTO workload_ids (uid) VALUES (?1)")?;
        let mut known: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let uid = e.workload_uid.as_str();
            let seq = match known.get(uid) {
                Some(seq) => *seq,
                None => {
                    let found: Option<i64> = lookup.query_row([uid], |r| r.get(0)).optional()?;
                    let seq = match found {
                        Some(seq) => seq,
                        None => {
                            number.execute([uid])?;
                            tx.last_insert_rowid()
                        }
                    };
                    known.insert(uid, seq);
                    seq
                }
            };
            out.push(seq);
        }
        Ok(out)
    }

    fn read_row(r: &rusqlite::Row<'_>) -> Result<StoredEntry, StoreError> {
        Self::raw_row(r)?.into_entry()
    }

    fn raw_row<'r>(r: &'r rusqlite::Row<'_>) -> Result<RawRow<'r>, StoreError> {
        let id: i64 = r.get(0)?;
        let text = |i: usize, column: &'static str| -> Result<&'r str, StoreError> {
            match r.get_ref(i)? {
                rusqlite::types::ValueRef::Text(t) => {
                    std::str::from_utf8(t).map_err(|_| StoreError::CorruptRow {
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
        RawRow::read(id, text, int)
    }
}

/// The entries matching `filter` with an id up to the largest when it starts,
/// as consecutive id ranges of [`PAGE`] ids, on a connection and thread of
/// its own (a [`PageReader`]'s): the consumer writes one page while this
/// decodes the next, into the pages the consumer handed back. Stops when the
/// consumer is gone.
fn read_pages(
    conn: rusqlite::Connection,
    filter: EntryFilter,
    pages: PageSender,
    spare: SparePages,
) {
    let read = || -> Result<(), StoreError> {
        let last_id: i64 =
            conn.query_row("SELECT COALESCE(MAX(id), 0) FROM entries", [], |r| r.get(0))?;
        let mut statement = conn.prepare(&format!(
            "SELECT id, {COLUMNS} FROM entries WHERE id > ?1 AND id <= ?5 AND (?2 IS NULL OR interval_start >= ?2) AND (?3 IS NULL OR interval_start < ?3) AND (?4 IS NULL OR team = ?4) AND {} ORDER BY id",
            filter.kinds_sql()
        ))?;
        let mut after = 0i64;
        while after < last_id {
            let upto = after.saturating_add(PAGE as i64).min(last_id);
            let mut page = spare.take();
            let mut rows = statement.query(rusqlite::params![
                after,
                filter.from,
                filter.to,
                filter.team,
                upto
            ])?;
            let mut filled = 0;
            while let Some(row) = rows.next()? {
                SqliteStore::raw_row(row)?.put(&mut page, filled)?;
                filled += 1;
            }
            page.truncate(filled);
            after = upto;
            if !page.is_empty() && pages.blocking_send(Ok(page)).is_err() {
                return Ok(());
            }
        }
        Ok(())
    };
    if let Err(e) = read() {
        let _ = pages.blocking_send(Err(e));
    }
}

impl LedgerStore for SqliteStore {
    async fn append(&self, entries: &[Entry]) -> Result<AppendOutcome, StoreError> {
        for e in entries {
            check(e)?;
        }
        let entries = entries.to_vec();
        let out = self.with_conn(move |conn| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let mut out = AppendOutcome::default();
            {
                let mut insert = tx.prepare_cached(&format!(
                    "INSERT INTO entries (workload_seq, {COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22) ON CONFLICT {CONFLICT_TARGET} DO NOTHING"
                ))?;
                let mut existing = tx.prepare_cached(&format!(
                    "SELECT id, {COLUMNS} FROM entries WHERE workload_seq = ?1 AND idempotency_key = ?2"
                ))?;
                let seqs = Self::workload_seqs(&tx, &entries)?;
                let mut inserted = Vec::with_capacity(entries.len());
                for (e, seq) in entries.iter().zip(&seqs) {
                    let n = insert.execute(rusqlite::params![
                        seq,
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
                        e.devices.join(","),
                        e.cluster,
                    ])?;
                    if n == 1 {
                        out.inserted += 1;
                        inserted.push((e, tx.last_insert_rowid()));
                        continue;
                    }
                    let stored = {
                        let mut rows = existing.query(rusqlite::params![seq, e.key])?;
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
                let mut add = tx.prepare_cached(add_to_totals_sql(Dialect::Sqlite))?;
                for ((budget, kind), (credits, count, first_id)) in totals_of(inserted) {
                    let credits = i64::try_from(credits).map_err(|_| StoreError::TotalOverflow {
                        budget: budget.to_string(),
                        kind,
                    })?;
                    add.execute(rusqlite::params![budget, kind, credits, count, first_id])?;
                }
            }
            tx.commit()?;
            Ok(out)
        })
        .await?;
        self.checkpointer.appended();
        Ok(out)
    }

    async fn kind_sums(&self, budget: Option<&str>) -> Result<KindSums, StoreError> {
        let budget = budget.map(str::to_string);
        self.with_conn(move |conn| {
            // The totals each append keeps (migration 5), not a sum over
            // millions of entries; verify compares them with the entries.
            let mut stmt = conn.prepare_cached(
                "SELECT budget, kind, credits, first_id FROM budget_totals WHERE (?1 IS NULL OR budget = ?1)",
            )?;
            let mut rows = stmt.query([budget])?;
            let mut out = KindSums::new();
            while let Some(r) = rows.next()? {
                let b: String = r.get(0)?;
                let k: String = r.get(1)?;
                let sum: i64 = r.get(2)?;
                // A row of the group, so a bad kind is reported with a real row id.
                let first_id: i64 = r.get(3)?;
                let kind = group_kind(first_id, &k, &b)?;
                out.entry(b).or_default().insert(kind, i128::from(sum));
            }
            Ok(out)
        })
        .await
    }

    async fn page_reader(&self, filter: &EntryFilter) -> Result<PageReader, StoreError> {
        // A connection of its own, on a thread of its own, so a scan of
        // millions of rows neither waits for nor delays the appends on the
        // store's connection (WAL: readers and the writer do not block).
        let path = self.path.clone();
        let conn = tokio::task::spawn_blocking(move || Self::connect(&path))
            .await
            .map_err(|e| StoreError::Join(e.to_string()))??;
        let filter = filter.clone();
        Ok(PageReader::spawn(move |pages, spare| async move {
            let failed = pages.clone();
            let reading =
                tokio::task::spawn_blocking(move || read_pages(conn, filter, pages, spare));
            if let Err(e) = reading.await {
                // A panic on the reading thread: an error, never a short export.
                let _ = failed
                    .send(Err(StoreError::Join(format!(
                        "the page reader stopped: {e}"
                    ))))
                    .await;
            }
        }))
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
                "SELECT id, {COLUMNS} FROM entries WHERE workload_seq = (SELECT seq FROM workload_ids WHERE uid = ?1) ORDER BY id"
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
                "SELECT id, {COLUMNS} FROM entries WHERE workload_seq = (SELECT seq FROM workload_ids WHERE uid = ?1) AND idempotency_key = ?2"
            ))?;
            let mut rows = stmt.query([key_workload_uid(&key), &key])?;
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
                if let Some(id) = r.get::<_, Option<i64>>(24)? {
                    return Err(corrupt_aggregated(id, "credits", &within()));
                }
                if let Some(id) = r.get::<_, Option<i64>>(25)? {
                    return Err(corrupt_aggregated(id, "interval_end", &within()));
                }
                let posted: Option<i64> = r.get(22)?;
                let posted_until: i64 = r.get(23)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::store::schema::migration_1;
    use crate::ledger::store::{for_each_entry, verify};

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
                    COLUMNS.trim_end_matches(", rate, devices, cluster")
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

    /// A version-4 SQLite ledger as the kaccel before schema version 5 wrote
    /// it: that DDL, versions 1-4 recorded, rows inserted directly.
    fn v4_file(path: &Path, entries: &[Entry]) {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch(CREATE_MIGRATIONS_TABLE).unwrap();
        conn.execute_batch(&crate::ledger::store::schema_up_to(4, Dialect::Sqlite))
            .unwrap();
        for version in 1..=4 {
            conn.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, 1767225600)",
                [version],
            )
            .unwrap();
        }
        for e in entries {
            conn.execute(
                &format!(
                    "INSERT INTO entries ({}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)",
                    COLUMNS.trim_end_matches(", cluster")
                ),
                rusqlite::params![
                    e.key, e.kind.as_str(), e.budget, e.team, e.namespace, e.workload,
                    e.workload_uid, i64::from(e.admission), e.class, e.flavor, e.resource,
                    e.device_units as i64, e.start, e.end, e.credits, e.rate_card, e.reason,
                    e.created_at, e.rate as i64, e.devices.join(","),
                ],
            )
            .unwrap();
        }
    }

    /// Schema version 4 (the key UNIQUE on its own, indexed by UID) becomes 5
    /// (workload numbers, the key unique per workload) with every row kept.
    #[tokio::test]
    async fn sqlite_version_4_is_upgraded_in_place() {
        use crate::ledger::conformance::{upgraded_ledger_keeps_everything, version_4_ledger};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v4.db");
        v4_file(&path, &version_4_ledger());
        assert!(sqlite_indexes(&path).contains(&"entries_workload_uid".to_string()));
        let store = SqliteStore::open(&path).await.unwrap();
        assert_eq!(sqlite_indexes(&path), CURRENT_INDEXES);
        upgraded_ledger_keeps_everything(&store).await;
        // Workloads numbered in the order they first reached the ledger (the
        // budget-level entries' empty UID first: the grant is row 1).
        let numbered: Vec<(i64, String)> = store
            .with_conn(|conn| {
                let mut stmt = conn.prepare("SELECT seq, uid FROM workload_ids ORDER BY seq")?;
                let v = stmt
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                Ok(v)
            })
            .await
            .unwrap();
        assert_eq!(
            numbered,
            [(1, ""), (2, "u1"), (3, "u2"), (4, "u3")].map(|(n, u)| (n, u.to_string()))
        );
        // The key is still unique: the old UNIQUE is gone, the new index holds.
        let err = store
            .with_conn(|conn| {
                conn.execute(
                    "INSERT INTO entries SELECT NULL, idempotency_key, kind, budget, team, workload_namespace, workload_name, workload_uid, admission, class, flavor, resource, device_units, interval_start, interval_end, credits, rate_card, reason, created_at, rate, devices, workload_seq, cluster FROM entries WHERE id = 2",
                    [],
                )?;
                Ok(())
            })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("UNIQUE"), "{err}");
    }

    /// The indexes of `entries` at [`SCHEMA_VERSION`](crate::ledger::store::SCHEMA_VERSION).
    const CURRENT_INDEXES: [&str; 5] = [
        "entries_budget_created",
        "entries_budget_kind",
        "entries_interval_start",
        "entries_reserves",
        "entries_workload_key",
    ];

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
        // Version 3 adds the rate, version 4 the devices; rows written before
        // read them as 0 and none.
        for e in &mut entries {
            e.rate = 0;
            e.devices.clear();
        }
        assert_eq!(
            sqlite_indexes(&path),
            ["entries_budget_created", "entries_interval_start"]
        );

        let store = SqliteStore::open(&path).await.unwrap();
        assert_eq!(
            store.schema_version().await.unwrap(),
            crate::ledger::store::SCHEMA_VERSION
        );
        assert_eq!(sqlite_indexes(&path), CURRENT_INDEXES);
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
        assert_eq!(store.schema_version().await.unwrap(), 6);
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
        assert_eq!(versions, [1, 2, 3, 4, 5, 6]);
    }

    /// The admission queries use the indexes (migrations 2 and 5) rather than
    /// scanning the table.
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
                    plan(&format!("SELECT id, {COLUMNS} FROM entries WHERE workload_seq = (SELECT seq FROM workload_ids WHERE uid = 'u') ORDER BY id"))?,
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
            plans[0].contains("USING INDEX entries_workload_key"),
            "{}",
            plans[0]
        );
        assert!(
            plans[1].contains("USING INDEX entries_reserves"),
            "{}",
            plans[1]
        );
        assert!(
            plans[1].contains("SEARCH p USING INDEX entries_workload_key"),
            "{}",
            plans[1]
        );
        assert!(
            plans[1].contains("SEARCH v USING INDEX entries_workload_key"),
            "{}",
            plans[1]
        );
        assert!(
            plans[2].contains("USING INDEX entries_budget_kind"),
            "{}",
            plans[2]
        );
    }
}
