//! The ledger store suite against SQLite (a temporary file), plus SQLite-only
//! failure cases: corrupted rows, a schema from the future, a bad path.

use kaccel::ledger::conformance as suite;
use kaccel::ledger::store::{
    EntryFilter, LedgerStore, SCHEMA_VERSION, SqliteStore, Store, StoreError, for_each_entry,
    verify,
};

async fn fresh() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("ledger.db"))
        .await
        .unwrap();
    (dir, store)
}

macro_rules! suite_tests {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $name() {
            let (_dir, store) = fresh().await;
            suite::$name(&store).await;
        }
    )*};
}

kaccel::ledger_conformance_suite!(suite_tests);

#[tokio::test]
async fn survives_reopen_and_opens_by_url() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    {
        let s = SqliteStore::open(&path).await.unwrap();
        s.append(&suite::lifecycle("b1", "t", "u1", 1, 2))
            .await
            .unwrap();
    }
    let s = Store::open(&format!("sqlite:{}", path.display()))
        .await
        .unwrap();
    assert_eq!(s.schema_version().await.unwrap(), SCHEMA_VERSION);
    assert!(verify(&s).await.unwrap().ok());
    assert_eq!(s.balances("b1").await.unwrap().spent, 8_000_000);
}

#[tokio::test]
async fn corrupted_rows_are_named() {
    let (dir, store) = fresh().await;
    store
        .append(&suite::lifecycle("b1", "t", "u1", 1, 2))
        .await
        .unwrap();
    let raw = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
    raw.execute("UPDATE entries SET credits = 'lots' WHERE id = 3", [])
        .unwrap();
    let err = verify(&store).await.unwrap_err();
    match &err {
        StoreError::CorruptRow { id, column, .. } => assert_eq!((*id, *column), (3, "credits")),
        other => panic!("expected a corrupt row error, got {other}"),
    }
    assert!(err.to_string().contains("row id 3"), "{err}");
    raw.execute(
        "UPDATE entries SET credits = 1, kind = 'Gift' WHERE id = 3",
        [],
    )
    .unwrap();
    let err = for_each_entry(&store, &EntryFilter::default(), |_| Ok::<_, StoreError>(()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("column kind"), "{err}");
    let err = verify(&store).await.unwrap_err();
    match &err {
        StoreError::CorruptRow { id, column, .. } => assert_eq!((*id, *column), (3, "kind")),
        other => panic!("expected a corrupt row error, got {other}"),
    }
}

/// Balances come from the totals each append keeps (schema 5), so a row
/// changed behind kaccel's back does not move them, and verify, which folds
/// every entry, reports the difference; a changed total is caught the same way.
#[tokio::test]
async fn verify_compares_the_entries_with_the_kept_totals() {
    let (dir, store) = fresh().await;
    store
        .append(&suite::lifecycle("b1", "t", "u1", 1, 2))
        .await
        .unwrap();
    let before = store.balances("b1").await.unwrap();
    assert!(verify(&store).await.unwrap().ok());
    let raw = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
    raw.execute("UPDATE entries SET credits = credits + 1 WHERE id = 3", [])
        .unwrap();
    assert_eq!(store.balances("b1").await.unwrap(), before);
    let report = verify(&store).await.unwrap();
    let text = report.problems.join("\n");
    assert!(
        text.contains("budget b1: entries add up to") && text.contains("the store's totals say"),
        "{text}"
    );
    raw.execute_batch(
        "UPDATE entries SET credits = credits - 1 WHERE id = 3;
         UPDATE budget_totals SET credits = credits + 5 WHERE budget = 'b1' AND kind = 'Grant'",
    )
    .unwrap();
    let text = verify(&store).await.unwrap().problems.join("\n");
    assert!(text.contains("budget b1: entries add up to"), "{text}");
}

#[tokio::test]
async fn corrupted_rows_are_named_by_the_admission_queries() {
    let (dir, store) = fresh().await;
    // ids: 1 grant, 2 reserve, 3 and 4 posts, 5 void; 6 reserve, 7 post (open).
    store
        .append(&suite::lifecycle("b1", "t", "u1", 1, 2))
        .await
        .unwrap();
    let mut open = suite::lifecycle("b1", "t", "u2", 1, 1);
    open.remove(0);
    open.pop();
    store.append(&open).await.unwrap();
    let raw = rusqlite::Connection::open(dir.path().join("ledger.db")).unwrap();
    let corrupt = |err: StoreError| match err {
        StoreError::CorruptRow { id, column, .. } => (id, column),
        other => panic!("expected a corrupt row error, got {other}"),
    };
    raw.execute("UPDATE entries SET kind = 'Gift' WHERE id = 4", [])
        .unwrap();
    let err = store.entries_for_workload("u1").await.unwrap_err();
    assert_eq!(corrupt(err), (4, "kind"));
    raw.execute_batch(
        "UPDATE entries SET kind = 'Post' WHERE id = 4; UPDATE entries SET admission = -1 WHERE id = 6",
    )
    .unwrap();
    let err = store.entry_by_key(&open[0].key).await.unwrap_err();
    assert_eq!(corrupt(err), (6, "admission"));
    raw.execute("UPDATE entries SET admission = 'one' WHERE id = 6", [])
        .unwrap();
    let err = store.open_reservations().await.unwrap_err();
    assert_eq!(corrupt(err), (6, "admission"));
    raw.execute("UPDATE entries SET admission = 1 WHERE id = 6", [])
        .unwrap();
    assert_eq!(store.open_reservations().await.unwrap().len(), 1);
    // A corrupt post of an open reservation, and in a posted sum.
    raw.execute("UPDATE entries SET credits = 'lots' WHERE id = 7", [])
        .unwrap();
    let err = store.open_reservations().await.unwrap_err();
    assert_eq!(corrupt(err), (7, "credits"));
    let err = store.posted_between("b1", 0, i64::MAX).await.unwrap_err();
    assert_eq!(corrupt(err), (7, "credits"));
    raw.execute("UPDATE entries SET credits = -3 WHERE id = 7", [])
        .unwrap();
    let err = store.open_reservations().await.unwrap_err();
    assert_eq!(corrupt(err), (7, "credits"));
    let err = store.posted_between("b1", 0, i64::MAX).await.unwrap_err();
    assert!(err.to_string().contains("row id 7"), "{err}");
    raw.execute(
        "UPDATE entries SET credits = 4000000, interval_end = 'late' WHERE id = 7",
        [],
    )
    .unwrap();
    let err = store.open_reservations().await.unwrap_err();
    assert_eq!(corrupt(err), (7, "interval_end"));
}

#[tokio::test]
async fn schema_too_new_is_refused() {
    let (dir, store) = fresh().await;
    drop(store);
    let path = dir.path().join("ledger.db");
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute(
        "INSERT INTO schema_migrations (version, applied_at) VALUES (99, 0)",
        [],
    )
    .unwrap();
    let err = SqliteStore::open(&path).await.err().unwrap();
    assert!(
        matches!(
            err,
            StoreError::SchemaTooNew {
                found: 99,
                supported: SCHEMA_VERSION
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn bad_urls_and_paths_are_clear() {
    let err = Store::open("mysql://x").await.err().unwrap();
    assert!(err.to_string().contains("sqlite:PATH"), "{err}");
    let err = Store::open("sqlite:/nonexistent-dir/sub/ledger.db")
        .await
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("/nonexistent-dir/sub/ledger.db"),
        "{err}"
    );
}

#[tokio::test]
async fn unreachable_postgres_names_the_url_without_password() {
    let err = Store::open("postgres://kaccel:hunter2@127.0.0.1:1/ledger?connect_timeout=2")
        .await
        .err()
        .unwrap();
    let text = err.to_string();
    assert!(matches!(err, StoreError::Unreachable { .. }), "{text}");
    assert!(text.contains("kaccel:***@127.0.0.1:1"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}
