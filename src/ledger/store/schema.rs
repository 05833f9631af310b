//! The SQL both backends share: the schema version, the column list, the
//! migrations and the open-reservations query.

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = 4;

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

pub(super) const COLUMNS: &str = "idempotency_key, kind, budget, team, workload_namespace, workload_name, workload_uid, admission, class, flavor, resource, device_units, interval_start, interval_end, credits, rate_card, reason, created_at, rate, devices";

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

/// The DDL that takes the schema from `version - 1` to `version`.
pub(super) fn migration(version: i64, id_column: &str) -> String {
    match version {
        1 => migration_1(id_column),
        2 => MIGRATION_2.to_string(),
        3 => MIGRATION_3.to_string(),
        4 => MIGRATION_4.to_string(),
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
/// 0..=20 are the Reserve's `id` and [`COLUMNS`] (read by `read_row`), 21 the
/// line's posted sum (`sum`, as the backend wants it), 22 its latest post end,
/// 23 and 24 (`check`) the first post id with a corrupt `credits`, resp.
/// `interval_end`, or NULL. Posts and the void are found through the
/// (workload_uid, admission, kind) index, Reserves through their partial index;
/// [`merge_open_lines`] folds a line's terms into one [`OpenReservation`].
///
/// [`LedgerStore::open_reservations`]: super::LedgerStore::open_reservations
/// [`merge_open_lines`]: super::row::merge_open_lines
/// [`OpenReservation`]: super::OpenReservation
pub(super) fn open_reservations_sql(sum: &str, check: &str) -> String {
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
