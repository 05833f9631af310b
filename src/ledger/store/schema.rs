//! The SQL both backends share: the schema version, the column list, the
//! migrations and the open-reservations query.

use crate::ledger::entry::Entry;

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = 6;

/// The table that records which migrations ran (the same in both backends).
pub(super) const CREATE_MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)";

/// The migrations a store at schema version `found` still needs; an error for
/// a store written by a newer kaccel.
pub(super) fn pending_migrations(
    found: i64,
) -> Result<std::ops::RangeInclusive<i64>, super::StoreError> {
    if found > SCHEMA_VERSION {
        return Err(super::StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    Ok((found + 1)..=SCHEMA_VERSION)
}

pub(super) const COLUMNS: &str = "idempotency_key, kind, budget, team, workload_namespace, workload_name, workload_uid, admission, class, flavor, resource, device_units, interval_start, interval_end, credits, rate_card, reason, created_at, rate, devices, cluster";

/// [`COLUMNS`] as schema version 5 had them (migration 5 copies these).
const COLUMNS_V5: &str = "idempotency_key, kind, budget, team, workload_namespace, workload_name, workload_uid, admission, class, flavor, resource, device_units, interval_start, interval_end, credits, rate_card, reason, created_at, rate, devices";

pub(super) fn migration_1(id_column: &str) -> String {
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

/// The devices an entry's admission held, comma-separated ('' when unknown).
const MIGRATION_4: &str = "ALTER TABLE entries ADD COLUMN devices TEXT NOT NULL DEFAULT '';";

/// The MultiKueue worker cluster of an entry's admission ('' for this cluster).
const MIGRATION_6: &str = "ALTER TABLE entries ADD COLUMN cluster TEXT NOT NULL DEFAULT '';";

/// `entries` as migration 5 leaves it, for SQLite's rebuild (it cannot drop a
/// column's UNIQUE in place).
const SQLITE_V5_TABLE: &str = "CREATE TABLE entries_v5 (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            idempotency_key TEXT NOT NULL,
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
            created_at BIGINT NOT NULL,
            rate BIGINT NOT NULL DEFAULT 0,
            devices TEXT NOT NULL DEFAULT '',
            workload_seq BIGINT NOT NULL
        );";

/// Migration 5's key: a workload's entries side by side under its sequence
/// number (`workload_ids.seq`, given in the order workloads first reach the
/// ledger), each key once per workload. Every key names its workload's UID
/// (budget-level keys none, see [`Entry::validate`]), so this is as unique as
/// the key alone was. UIDs are random, so an index led by them (or by keys
/// that contain them) took a page write per append at any size once the
/// ledger outgrew memory; sequence numbers are recent for the workloads being
/// charged now, so the pages an append touches are the index's last few,
/// however large the ledger. The UID -> number lookup is one random insert per
/// workload, not per entry.
///
/// [`Entry::validate`]: crate::ledger::entry::Entry::validate
const WORKLOAD_KEY_INDEX: &str =
    "CREATE UNIQUE INDEX entries_workload_key ON entries (workload_seq, idempotency_key);";

/// The conflict target of an idempotent insert (the columns of
/// [`WORKLOAD_KEY_INDEX`]).
pub(super) const CONFLICT_TARGET: &str = "(workload_seq, idempotency_key)";

/// Adds an append's inserted credits to its (budget, kind) total in
/// `budget_totals` (migration 5), which balances and verify read instead of
/// summing millions of entries: ?1/$1 budget, 2 kind, 3 credits, 4 entries,
/// 5 the lowest id among them (PostgreSQL: arrays of each).
pub(super) fn add_to_totals_sql(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => {
            "INSERT INTO budget_totals (budget, kind, credits, entries, first_id) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (budget, kind) DO UPDATE SET credits = credits + excluded.credits,
                 entries = entries + excluded.entries, first_id = MIN(first_id, excluded.first_id)"
        }
        // One statement for the whole append: arrays, one element per
        // (budget, kind); credits as text, exact.
        Dialect::Postgres => {
            "INSERT INTO budget_totals (budget, kind, credits, entries, first_id)
             SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[]::NUMERIC[], $4::BIGINT[], $5::BIGINT[])
             ON CONFLICT (budget, kind) DO UPDATE SET credits = budget_totals.credits + excluded.credits,
                 entries = budget_totals.entries + excluded.entries,
                 first_id = LEAST(budget_totals.first_id, excluded.first_id)"
        }
    }
}

/// An append's inserted entries summed per (budget, kind): credits, entries,
/// lowest id.
pub(super) fn totals_of<'a>(
    inserted: impl IntoIterator<Item = (&'a Entry, i64)>,
) -> std::collections::BTreeMap<(&'a str, &'static str), (i128, i64, i64)> {
    let mut out = std::collections::BTreeMap::new();
    for (e, id) in inserted {
        let t = out
            .entry((e.budget.as_str(), e.kind.as_str()))
            .or_insert((0i128, 0i64, id));
        t.0 += i128::from(e.credits);
        t.1 += 1;
        t.2 = t.2.min(id);
    }
    out
}

/// The backend a migration's DDL is written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    fn id_column(self) -> &'static str {
        match self {
            Dialect::Sqlite => "INTEGER PRIMARY KEY AUTOINCREMENT",
            Dialect::Postgres => "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        }
    }
}

/// Migration 5: workload sequence numbers (`workload_ids`, numbered in the
/// order of each UID's first entry) and `(workload_seq, idempotency_key)`
/// unique, instead of the key alone and the `(workload_uid, admission, kind)`
/// index. PostgreSQL alters the table in place; SQLite copies the rows (ids
/// kept, and the AUTOINCREMENT high-water mark with them) into a table without
/// the key's UNIQUE.
fn migration_5(dialect: Dialect) -> String {
    let number_workloads = "INSERT INTO workload_ids (uid)
             SELECT workload_uid FROM entries GROUP BY workload_uid ORDER BY MIN(id);";
    let sum_type = match dialect {
        Dialect::Sqlite => "BIGINT",
        // Exact beyond 64 bits, as SUM over the entries was.
        Dialect::Postgres => "NUMERIC",
    };
    let totals = format!(
        "CREATE TABLE budget_totals (budget TEXT NOT NULL, kind TEXT NOT NULL, credits {sum_type} NOT NULL,
             entries BIGINT NOT NULL, first_id BIGINT NOT NULL, PRIMARY KEY (budget, kind));
         INSERT INTO budget_totals (budget, kind, credits, entries, first_id)
             SELECT budget, kind, SUM(credits), COUNT(*), MIN(id) FROM entries GROUP BY budget, kind;"
    );
    match dialect {
        Dialect::Postgres => format!(
            "CREATE TABLE workload_ids (seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, uid TEXT NOT NULL UNIQUE);
             {number_workloads}
             ALTER TABLE entries ADD COLUMN workload_seq BIGINT;
             UPDATE entries e SET workload_seq = w.seq FROM workload_ids w WHERE w.uid = e.workload_uid;
             ALTER TABLE entries ALTER COLUMN workload_seq SET NOT NULL;
             ALTER TABLE entries DROP CONSTRAINT entries_idempotency_key_key;
             DROP INDEX entries_workload_uid;
             {WORKLOAD_KEY_INDEX}
             {totals}"
        ),
        Dialect::Sqlite => format!(
            "CREATE TABLE workload_ids (seq INTEGER PRIMARY KEY, uid TEXT NOT NULL UNIQUE);
             {number_workloads}
             {SQLITE_V5_TABLE}
             INSERT INTO entries_v5 (id, workload_seq, {COLUMNS_V5})
                 SELECT e.id, w.seq, {} FROM entries e JOIN workload_ids w ON w.uid = e.workload_uid ORDER BY e.id;
             UPDATE sqlite_sequence SET seq = (SELECT MAX(seq) FROM sqlite_sequence WHERE name IN ('entries', 'entries_v5'))
                 WHERE name = 'entries_v5';
             INSERT INTO sqlite_sequence (name, seq) SELECT 'entries_v5', seq FROM sqlite_sequence
                 WHERE name = 'entries' AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'entries_v5');
             DROP TABLE entries;
             ALTER TABLE entries_v5 RENAME TO entries;
             CREATE INDEX entries_budget_created ON entries (budget, created_at);
             CREATE INDEX entries_interval_start ON entries (interval_start);
             CREATE INDEX entries_budget_kind ON entries (budget, kind, interval_end);
             CREATE INDEX entries_reserves ON entries (id) WHERE kind = 'Reserve';
             {WORKLOAD_KEY_INDEX}
             {totals}",
            qualified(COLUMNS_V5, "e")
        ),
    }
}

/// The DDL of schema versions 1 to `version`, as kaccel applied it: for tests
/// that build an older ledger and open it with this build.
pub fn schema_up_to(version: i64, dialect: Dialect) -> String {
    (1..=version)
        .map(|v| migration(v, dialect))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The DDL that takes the schema from `version - 1` to `version`.
pub(super) fn migration(version: i64, dialect: Dialect) -> String {
    match version {
        1 => migration_1(dialect.id_column()),
        2 => MIGRATION_2.to_string(),
        3 => MIGRATION_3.to_string(),
        4 => MIGRATION_4.to_string(),
        5 => migration_5(dialect),
        6 => MIGRATION_6.to_string(),
        _ => unreachable!("no migration {version} (SCHEMA_VERSION is {SCHEMA_VERSION})"),
    }
}

/// [`COLUMNS`] qualified with a table alias (`r.idempotency_key, r.kind, …`).
fn columns_of(alias: &str) -> String {
    qualified(COLUMNS, alias)
}

fn qualified(columns: &str, alias: &str) -> String {
    columns
        .split(", ")
        .map(|c| format!("{alias}.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The query of [`LedgerStore::open_reservations`], shared by both backends:
/// one row per Reserve entry (a line's term) whose line has no Void; columns
/// 0..=21 are the Reserve's `id` and [`COLUMNS`] (read by `read_row`), 22 the
/// line's posted sum (`sum`, as the backend wants it), 23 its latest post end,
/// 24 and 25 (`check`) the first post id with a corrupt `credits`, resp.
/// `interval_end`, or NULL. Posts and the void are found through the
/// (workload_seq, idempotency_key) index, Reserves through their partial index;
/// [`merge_open_lines`] folds a line's terms into one [`OpenReservation`].
///
/// [`LedgerStore::open_reservations`]: super::LedgerStore::open_reservations
/// [`merge_open_lines`]: super::row::merge_open_lines
/// [`OpenReservation`]: super::OpenReservation
pub(super) fn open_reservations_sql(sum: &str, check: &str) -> String {
    let cols = columns_of("r");
    let same_line = |x: &str| {
        format!(
            "{x}.workload_seq = r.workload_seq AND {x}.admission = r.admission AND {x}.budget = r.budget \
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
