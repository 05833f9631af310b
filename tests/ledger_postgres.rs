//! The ledger store suite against a real PostgreSQL (from Debian's packages).
//! Start one with `e2e/postgres.sh start` and pass its URL:
//!
//!   KACCEL_TEST_POSTGRES_URL=$(e2e/postgres.sh start) cargo test --features e2e --test ledger_postgres
//!
//! Without the variable every test fails (never skips) and says how to start it.

use std::sync::atomic::{AtomicU32, Ordering};

use kaccel::ledger::conformance as suite;
use kaccel::ledger::store::{
    Dialect, EntryFilter, LedgerStore, PostgresStore, SCHEMA_VERSION, StoreError, for_each_entry,
    schema_up_to, verify,
};

fn admin_url() -> String {
    std::env::var("KACCEL_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!(
            "KACCEL_TEST_POSTGRES_URL is not set: start a throwaway server with \
             `export KACCEL_TEST_POSTGRES_URL=$(e2e/postgres.sh start)` and run again"
        )
    })
}

/// A fresh database per test, so tests run in parallel and start empty.
async fn fresh() -> (String, PostgresStore) {
    let url = fresh_database().await;
    let store = PostgresStore::connect(&url).await.unwrap();
    (url, store)
}

/// Test databases are named `kaccel_test_<pid>_<n>_<created, Unix ms>`.
const TEST_DATABASE_PREFIX: &str = "kaccel_test_";

/// A test database older than this is a leftover of an earlier run (a run of
/// the suite takes under a minute): dropped by the next run.
const LEFTOVER_AFTER_MS: i64 = 60 * 60 * 1000;

/// An empty database of its own (no kaccel schema yet); its URL.
async fn fresh_database() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    static LEFTOVERS_DROPPED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    let admin = admin_url();
    let name = format!(
        "{TEST_DATABASE_PREFIX}{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst),
        jiff::Timestamp::now().as_millisecond()
    );
    let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!("cannot reach {admin}: {e}; is `e2e/postgres.sh start` running?")
        });
    tokio::spawn(conn);
    // The tests leave their databases behind (a failed one is worth reading);
    // the server's folder outlives the run (e2e/postgres.sh), so without this
    // every run of the suite kept ~20 more, about 180 MB.
    LEFTOVERS_DROPPED
        .get_or_init(|| drop_leftover_databases(&client))
        .await;
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
    format!("{base}/{name}")
}

/// Drops the test databases created more than [`LEFTOVER_AFTER_MS`] ago.
async fn drop_leftover_databases(admin: &tokio_postgres::Client) {
    let now = jiff::Timestamp::now().as_millisecond();
    let names: Vec<String> = column(
        admin,
        &format!(
            "SELECT datname FROM pg_database WHERE starts_with(datname, '{TEST_DATABASE_PREFIX}')"
        ),
    )
    .await;
    for name in names {
        if leftover(&name, now) {
            admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await
                .unwrap_or_else(|e| panic!("cannot drop the leftover test database {name}: {e}"));
        }
    }
}

/// Whether `name` is a test database created more than [`LEFTOVER_AFTER_MS`]
/// before `now` (Unix ms); a name not of that form is not the suite's.
fn leftover(name: &str, now: i64) -> bool {
    name.strip_prefix(TEST_DATABASE_PREFIX)
        .and_then(|rest| rest.rsplit('_').next())
        .and_then(|created| created.parse::<i64>().ok())
        .is_some_and(|created| now - created > LEFTOVER_AFTER_MS)
}

#[test]
fn only_the_suites_old_databases_are_leftovers() {
    let now = 1_796_600_000_000;
    let hour = 60 * 60 * 1000;
    assert!(leftover(
        &format!("kaccel_test_1907_3_{}", now - hour - 1),
        now
    ));
    assert!(!leftover(
        &format!("kaccel_test_1907_3_{}", now - hour + 1),
        now
    ));
    assert!(!leftover(&format!("kaccel_test_1907_3_{now}"), now));
    assert!(!leftover("kaccel", now));
    assert!(!leftover(&format!("bench_{}", now - 10 * hour), now));
    assert!(!leftover("kaccel_test_not_a_time", now));
}

async fn raw(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

/// The first column of what `sql` returns, in order.
async fn column<T: for<'a> tokio_postgres::types::FromSql<'a>>(
    c: &tokio_postgres::Client,
    sql: &str,
) -> Vec<T> {
    c.query(sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

macro_rules! suite_tests {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $name() {
            let (_url, store) = fresh().await;
            suite::$name(&store).await;
        }
    )*};
}

kaccel::ledger_conformance_suite!(suite_tests);

#[tokio::test]
async fn migrations_are_idempotent() {
    let (url, store) = fresh().await;
    store
        .append(&suite::lifecycle("b1", "t", "u1", 1, 2))
        .await
        .unwrap();
    drop(store);
    let again = PostgresStore::connect(&url).await.unwrap();
    assert_eq!(again.schema_version().await.unwrap(), SCHEMA_VERSION);
    assert!(verify(&again).await.unwrap().ok());
}

#[tokio::test]
async fn corrupted_rows_are_named() {
    let (url, store) = fresh().await;
    store
        .append(&suite::lifecycle("b1", "t", "u1", 1, 2))
        .await
        .unwrap();
    let c = raw(&url).await;
    c.batch_execute("UPDATE entries SET kind = 'Gift' WHERE id = 3")
        .await
        .unwrap();
    let err = for_each_entry(&store, &EntryFilter::default(), |_| Ok::<_, StoreError>(()))
        .await
        .unwrap_err();
    match &err {
        StoreError::CorruptRow { id, column, .. } => assert_eq!((*id, *column), (3, "kind")),
        other => panic!("expected a corrupt row error, got {other}"),
    }
    c.batch_execute("UPDATE entries SET kind = 'Post', credits = -4 WHERE id = 3")
        .await
        .unwrap();
    let err = verify(&store).await.unwrap_err();
    assert!(err.to_string().contains("column credits"), "{err}");
}

/// A ledger in schema version 4 (the DDL kaccel applied before version 5, rows
/// inserted directly) is upgraded with every row kept.
#[tokio::test]
async fn version_4_is_upgraded_in_place() {
    let url = fresh_database().await;
    let c = raw(&url).await;
    c.batch_execute(&format!(
        "CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL);
         INSERT INTO schema_migrations (version, applied_at) VALUES (1, 0), (2, 0), (3, 0), (4, 0);
         {}",
        schema_up_to(4, Dialect::Postgres)
    ))
    .await
    .unwrap();
    for e in suite::version_4_ledger() {
        c.execute(
            "INSERT INTO entries (idempotency_key, kind, budget, team, workload_namespace, workload_name, workload_uid, admission, class, flavor, resource, device_units, interval_start, interval_end, credits, rate_card, reason, created_at, rate, devices) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)",
            &[
                &e.key, &e.kind.as_str(), &e.budget, &e.team, &e.namespace, &e.workload,
                &e.workload_uid, &i64::from(e.admission), &e.class, &e.flavor, &e.resource,
                &(e.device_units as i64), &e.start, &e.end, &e.credits, &e.rate_card, &e.reason,
                &e.created_at, &(e.rate as i64), &e.devices.join(","),
            ],
        )
        .await
        .unwrap();
    }
    let store = PostgresStore::connect(&url).await.unwrap();
    suite::upgraded_ledger_keeps_everything(&store).await;
    let constraints: Vec<String> = column(
        &c,
        "SELECT conname::text FROM pg_constraint WHERE conrelid = 'entries'::regclass ORDER BY conname",
    )
    .await;
    assert_eq!(constraints, ["entries_pkey"]);
    let numbered: Vec<(i64, String)> = c
        .query("SELECT seq, uid FROM workload_ids ORDER BY seq", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let uids: Vec<&str> = numbered.iter().map(|(_, u)| u.as_str()).collect();
    assert_eq!(uids, ["", "u1", "u2", "u3"]);
}

#[tokio::test]
async fn version_1_is_upgraded_in_place() {
    let (url, store) = fresh().await;
    let entries = suite::lifecycle("b1", "t", "u1", 1, 2);
    store.append(&entries[..entries.len() - 1]).await.unwrap();
    drop(store);
    // Back to version 1: migration 2 only adds indexes, migration 3 the rate,
    // migration 4 the devices, migration 6 the cluster.
    let c = raw(&url).await;
    c.batch_execute(
        "DROP INDEX entries_workload_key; DROP INDEX entries_budget_kind; DROP INDEX entries_reserves;
         ALTER TABLE entries DROP COLUMN workload_seq;
         DROP TABLE workload_ids;
         DROP TABLE budget_totals;
         ALTER TABLE entries ADD CONSTRAINT entries_idempotency_key_key UNIQUE (idempotency_key);
         ALTER TABLE entries DROP COLUMN rate;
         ALTER TABLE entries DROP COLUMN devices;
         ALTER TABLE entries DROP COLUMN cluster;
         DELETE FROM schema_migrations WHERE version IN (2, 3, 4, 5, 6)",
    )
    .await
    .unwrap();
    let indexes = || {
        column::<String>(
            &c,
            "SELECT indexname FROM pg_indexes WHERE tablename = 'entries' ORDER BY indexname",
        )
    };
    assert!(
        !indexes()
            .await
            .contains(&"entries_workload_key".to_string())
    );
    let store = PostgresStore::connect(&url).await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), SCHEMA_VERSION);
    let got = indexes().await;
    for name in [
        "entries_budget_created",
        "entries_budget_kind",
        "entries_interval_start",
        "entries_reserves",
        "entries_workload_key",
    ] {
        assert!(got.contains(&name.to_string()), "{name} missing: {got:?}");
    }
    let versions: Vec<i64> =
        column(&c, "SELECT version FROM schema_migrations ORDER BY version").await;
    assert_eq!(versions, vec![1, 2, 3, 4, 5, 6]);
    let stored = store.entries_for_workload("u1").await.unwrap();
    let stored: Vec<_> = stored.into_iter().map(|s| s.entry).collect();
    // Rows written before version 3 read their rate as 0.
    let before: Vec<_> = entries[1..entries.len() - 1]
        .iter()
        .cloned()
        .map(|mut e| {
            e.rate = 0;
            e
        })
        .collect();
    assert_eq!(stored, before);
    assert_eq!(store.open_reservations().await.unwrap().len(), 1);
    assert!(verify(&store).await.unwrap().ok());
}

#[tokio::test]
async fn corrupted_rows_are_named_by_the_admission_queries() {
    let (url, store) = fresh().await;
    // ids: 1 grant, 2 reserve, 3 and 4 posts (open).
    let mut entries = suite::lifecycle("b1", "t", "u1", 1, 2);
    entries.pop();
    store.append(&entries).await.unwrap();
    let c = raw(&url).await;
    let corrupt = |err: StoreError| match err {
        StoreError::CorruptRow { id, column, .. } => (id, column),
        other => panic!("expected a corrupt row error, got {other}"),
    };
    c.batch_execute("UPDATE entries SET kind = 'Gift' WHERE id = 3")
        .await
        .unwrap();
    let err = store.entries_for_workload("u1").await.unwrap_err();
    assert_eq!(corrupt(err), (3, "kind"));
    c.batch_execute(
        "UPDATE entries SET kind = 'Post' WHERE id = 3; UPDATE entries SET admission = -1 WHERE id = 2",
    )
        .await
        .unwrap();
    let err = store.entry_by_key(&entries[1].key).await.unwrap_err();
    assert_eq!(corrupt(err), (2, "admission"));
    let err = store.open_reservations().await.unwrap_err();
    assert_eq!(corrupt(err), (2, "admission"));
    c.batch_execute("UPDATE entries SET admission = 1, credits = -4 WHERE id = 2")
        .await
        .unwrap();
    let err = store.open_reservations().await.unwrap_err();
    assert_eq!(corrupt(err), (2, "credits"));
    c.batch_execute("UPDATE entries SET credits = 40000000 WHERE id = 2; UPDATE entries SET credits = -4 WHERE id = 4")
        .await
        .unwrap();
    let err = store.open_reservations().await.unwrap_err();
    assert_eq!(corrupt(err), (4, "credits"));
    let err = store.posted_between("b1", 0, i64::MAX).await.unwrap_err();
    assert_eq!(corrupt(err), (4, "credits"));
}

#[tokio::test]
async fn schema_too_new_is_refused() {
    let (url, store) = fresh().await;
    drop(store);
    raw(&url)
        .await
        .batch_execute("INSERT INTO schema_migrations (version, applied_at) VALUES (99, 0)")
        .await
        .unwrap();
    let err = PostgresStore::connect(&url).await.err().unwrap();
    assert!(
        matches!(err, StoreError::SchemaTooNew { found: 99, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn reconnects_after_the_connection_drops() {
    let (url, store) = fresh().await;
    store
        .append(&suite::lifecycle("b1", "t", "u1", 1, 1))
        .await
        .unwrap();
    let db = url.rsplit_once('/').unwrap().1.to_string();
    // Kill every other backend of this database (the store's connection).
    raw(&admin_url())
        .await
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&db],
        )
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    // The first call may see the dying connection; a retry must succeed.
    let more = suite::lifecycle("b2", "t", "u2", 1, 1);
    let first = store.append(&more).await;
    if first.is_err() {
        store.append(&more).await.unwrap();
    }
    assert!(verify(&store).await.unwrap().ok());
    assert_eq!(store.balances("b2").await.unwrap().spent, 4_000_000);
}
