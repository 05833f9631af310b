//! The PostgreSQL backend: one tokio-postgres connection, re-dialled when dropped.

use super::row::{RawRow, check, conflict, corrupt_aggregated, group_kind, merge_open_lines};
use super::schema::{
    COLUMNS, CONFLICT_TARGET, CREATE_MIGRATIONS_TABLE, Dialect, add_to_totals_sql, migration,
    open_reservations_sql, pending_migrations, totals_of,
};
use super::{
    AppendOutcome, EntryFilter, KindSums, LedgerStore, OpenReservation, PAGE, PageReader,
    PageSender, SparePages, StoreError, StoredEntry, now_unix, redact_url,
};
use crate::ledger::entry::{Entry, key_workload_uid};

/// The production store: PostgreSQL over tokio-postgres (no TLS). A dropped
/// connection is re-established on the next call.
pub struct PostgresStore {
    url: String,
    client: tokio::sync::Mutex<Connection>,
}

/// The connection and the append's statements prepared on it (an append of
/// one entry would otherwise spend more round trips preparing than writing).
struct Connection {
    client: tokio_postgres::Client,
    append: Option<AppendStatements>,
}

impl std::ops::Deref for Connection {
    type Target = tokio_postgres::Client;
    fn deref(&self) -> &tokio_postgres::Client {
        &self.client
    }
}

impl std::ops::DerefMut for Connection {
    fn deref_mut(&mut self) -> &mut tokio_postgres::Client {
        &mut self.client
    }
}

#[derive(Clone)]
struct AppendStatements {
    number_workloads: tokio_postgres::Statement,
    workload_seqs: tokio_postgres::Statement,
    insert: tokio_postgres::Statement,
    add_to_totals: tokio_postgres::Statement,
}

impl AppendStatements {
    async fn prepare(client: &tokio_postgres::Client) -> Result<Self, StoreError> {
        // The whole append in one statement: an array per column, unnested in
        // the entries' order (ids follow it). Per-row statements, even
        // pipelined, cost the server an executor start each: 26,800 entries/s
        // at 10M rows on 2 cores.
        let insert_sql = format!(
            "INSERT INTO entries (workload_seq, {COLUMNS})
             SELECT c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, c20, c21, c22
             FROM unnest($1::BIGINT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[], $6::TEXT[], $7::TEXT[],
                         $8::TEXT[], $9::BIGINT[], $10::TEXT[], $11::TEXT[], $12::TEXT[], $13::BIGINT[],
                         $14::BIGINT[], $15::BIGINT[], $16::BIGINT[], $17::TEXT[], $18::TEXT[], $19::BIGINT[],
                         $20::BIGINT[], $21::TEXT[], $22::TEXT[])
                  WITH ORDINALITY AS t(c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, c20, c21, c22, n)
             ORDER BY n
             ON CONFLICT {CONFLICT_TARGET} DO NOTHING RETURNING id, workload_seq, idempotency_key"
        );
        let (number_workloads, workload_seqs, insert, add_to_totals) = futures::try_join!(
            client.prepare(
                "INSERT INTO workload_ids (uid) SELECT u FROM unnest($1::text[]) AS u ORDER BY u ON CONFLICT (uid) DO NOTHING"
            ),
            client.prepare("SELECT uid, seq FROM workload_ids WHERE uid = ANY($1::text[])"),
            client.prepare(&insert_sql),
            client.prepare(add_to_totals_sql(Dialect::Postgres)),
        )?;
        Ok(AppendStatements {
            number_workloads,
            workload_seqs,
            insert,
            add_to_totals,
        })
    }
}

impl PostgresStore {
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let client = Self::dial(url).await?;
        let store = PostgresStore {
            url: url.to_string(),
            client: tokio::sync::Mutex::new(Connection {
                client,
                append: None,
            }),
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

    async fn client(&self) -> Result<tokio::sync::MutexGuard<'_, Connection>, StoreError> {
        let mut guard = self.client.lock().await;
        if guard.is_closed() {
            *guard = Connection {
                client: Self::dial(&self.url).await?,
                append: None,
            };
        }
        Ok(guard)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // Serialise concurrent starters (several replicas, tests in parallel).
        tx.execute("SELECT pg_advisory_xact_lock(7238011)", &[])
            .await?;
        tx.batch_execute(CREATE_MIGRATIONS_TABLE).await?;
        let found: i64 = tx
            .query_one(
                "SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_migrations",
                &[],
            )
            .await?
            .get(0);
        for version in pending_migrations(found)? {
            tx.batch_execute(&migration(version, Dialect::Postgres))
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

    /// Each entry's workload sequence number (`workload_ids`), numbering the
    /// UIDs the ledger has not seen yet: one insert and one select per append,
    /// UIDs in sorted order so concurrent appends lock them alike.
    async fn workload_seqs(
        tx: &tokio_postgres::Transaction<'_>,
        statements: &AppendStatements,
        entries: &[Entry],
    ) -> Result<Vec<i64>, StoreError> {
        let uids: Vec<&str> = entries
            .iter()
            .map(|e| e.workload_uid.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        // Pipelined, in order on the connection: the select sees the insert.
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&uids];
        let (_, rows) = futures::try_join!(
            tx.execute(&statements.number_workloads, &params),
            tx.query(&statements.workload_seqs, &params),
        )?;
        let mut seq_of = std::collections::HashMap::with_capacity(rows.len());
        for r in &rows {
            seq_of.insert(r.try_get::<_, String>(0)?, r.try_get::<_, i64>(1)?);
        }
        entries
            .iter()
            .map(|e| {
                seq_of
                    .get(&e.workload_uid)
                    .copied()
                    .ok_or_else(|| StoreError::InvalidEntry {
                        key: e.key.clone(),
                        reason: format!("workload UID {:?} was not numbered", e.workload_uid),
                    })
            })
            .collect()
    }

    fn read_row(r: &tokio_postgres::Row) -> Result<StoredEntry, StoreError> {
        Self::raw_row(r)?.into_entry()
    }

    fn raw_row(r: &tokio_postgres::Row) -> Result<RawRow<'_>, StoreError> {
        let id: i64 = r.try_get(0)?;
        let text = |i: usize, column: &'static str| -> Result<&str, StoreError> {
            r.try_get::<_, &str>(i).map_err(|e| StoreError::CorruptRow {
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
        RawRow::read(id, text, int)
    }

    /// Decodes `rows` over the entries of `page` (a page the consumer is
    /// done with), growing or shortening it to fit.
    fn read_page_into(
        rows: &[tokio_postgres::Row],
        page: &mut Vec<StoredEntry>,
    ) -> Result<(), StoreError> {
        page.truncate(rows.len());
        for (at, row) in rows.iter().enumerate() {
            Self::raw_row(row)?.put(page, at)?;
        }
        Ok(())
    }
}

/// An [`EntryFilter`] in SQL: $2 from, $3 to, $4 team.
const FILTER_SQL: &str = "($2::BIGINT IS NULL OR interval_start >= $2) AND ($3::BIGINT IS NULL OR interval_start < $3) AND ($4::TEXT IS NULL OR team = $4)";

/// The entries matching a filter with an id in `($1, $5]`, in id order: the
/// page reader's pages (a range of ids, so several can be asked for at once).
fn id_range_sql(filter: &EntryFilter) -> String {
    format!(
        "SELECT id, {COLUMNS} FROM entries WHERE id > $1 AND id <= $5 AND {FILTER_SQL} AND {} ORDER BY id",
        filter.kinds_sql()
    )
}

/// Id ranges asked for at once by the page reader, pipelined on its
/// connection: with one query at a time the server waited for each request
/// and the machine sat a third idle.
const RANGES_IN_FLIGHT: usize = 3;

/// A [`PageReader`]'s task. The entries that exist when it starts (ids up to
/// the largest then) are read as consecutive id ranges of [`PAGE`] ids,
/// several queries in flight, each decoding its rows (a string per column)
/// as they arrive, while the consumer writes the page before: server,
/// decoding and consumer all work at once. A decode on the consumer's
/// task, one query at a time, left the server idle for most of an export
/// (185,000 rows/s at 2M entries on 2 cores). Sequence gaps (PostgreSQL
/// spends an id on every conflicting insert) only make a page shorter.
async fn read_pages(
    client: std::sync::Arc<tokio_postgres::Client>,
    statement: tokio_postgres::Statement,
    filter: EntryFilter,
    pages: PageSender,
    spare: SparePages,
) {
    let last_id: i64 = match client
        .query_one("SELECT COALESCE(MAX(id), 0)::BIGINT FROM entries", &[])
        .await
        .and_then(|row| row.try_get(0))
    {
        Ok(id) => id,
        Err(e) => {
            let _ = pages.send(Err(e.into())).await;
            return;
        }
    };
    let span = PAGE as i64;
    let mut next_after = 0i64;
    let mut in_flight = RangeQueries(std::collections::VecDeque::with_capacity(RANGES_IN_FLIGHT));
    loop {
        while in_flight.0.len() < RANGES_IN_FLIGHT && next_after < last_id {
            let (client, statement, filter) = (client.clone(), statement.clone(), filter.clone());
            let mut page = spare.take();
            let (after, upto) = (next_after, next_after.saturating_add(span).min(last_id));
            in_flight.0.push_back(tokio::spawn(async move {
                let rows = client
                    .query(
                        &statement,
                        &[&after, &filter.from, &filter.to, &filter.team, &upto],
                    )
                    .await?;
                PostgresStore::read_page_into(&rows, &mut page)?;
                Ok(page)
            }));
            next_after = upto;
        }
        let Some(oldest) = in_flight.0.pop_front() else {
            return;
        };
        let page = match oldest.await {
            Ok(Ok(page)) if page.is_empty() => continue,
            Ok(page) => page,
            // The query's task panicked or was cancelled (the runtime is
            // going away): an error, never a silently short export.
            Err(e) => Err(StoreError::Join(e.to_string())),
        };
        let failed = page.is_err();
        if pages.send(page).await.is_err() || failed {
            return;
        }
    }
}

/// The page reader's queries in id order, each decoding its own rows (on
/// whichever core is free); stopped with the reader.
struct RangeQueries(
    std::collections::VecDeque<tokio::task::JoinHandle<Result<Vec<StoredEntry>, StoreError>>>,
);

impl Drop for RangeQueries {
    fn drop(&mut self) {
        for query in &self.0 {
            query.abort();
        }
    }
}

impl LedgerStore for PostgresStore {
    async fn append(&self, entries: &[Entry]) -> Result<AppendOutcome, StoreError> {
        for e in entries {
            check(e)?;
        }
        let mut conn = self.client().await?;
        let statements = match &conn.append {
            Some(prepared) => prepared.clone(),
            None => {
                let prepared = AppendStatements::prepare(&conn).await?;
                conn.append = Some(prepared.clone());
                prepared
            }
        };
        let tx = conn.transaction().await?;
        let seqs = Self::workload_seqs(&tx, &statements, entries).await?;
        let column = |f: fn(&Entry) -> &str| -> Vec<&str> { entries.iter().map(f).collect() };
        let number = |f: fn(&Entry) -> i64| -> Vec<i64> { entries.iter().map(f).collect() };
        let keys = column(|e| &e.key);
        let kinds = column(|e| e.kind.as_str());
        let budgets = column(|e| &e.budget);
        let teams = column(|e| &e.team);
        let namespaces = column(|e| &e.namespace);
        let workloads = column(|e| &e.workload);
        let uids = column(|e| &e.workload_uid);
        let admissions = number(|e| i64::from(e.admission));
        let classes = column(|e| &e.class);
        let flavors = column(|e| &e.flavor);
        let resources = column(|e| &e.resource);
        let device_units = number(|e| e.device_units as i64);
        let starts = number(|e| e.start);
        let ends = number(|e| e.end);
        let credits = number(|e| e.credits);
        let rate_cards = column(|e| &e.rate_card);
        let reasons = column(|e| &e.reason);
        let created = number(|e| e.created_at);
        let rates = number(|e| e.rate as i64);
        let devices: Vec<String> = entries.iter().map(|e| e.devices.join(",")).collect();
        let clusters = column(|e| &e.cluster);
        let rows = tx
            .query(
                &statements.insert,
                &[
                    &seqs,
                    &keys,
                    &kinds,
                    &budgets,
                    &teams,
                    &namespaces,
                    &workloads,
                    &uids,
                    &admissions,
                    &classes,
                    &flavors,
                    &resources,
                    &device_units,
                    &starts,
                    &ends,
                    &credits,
                    &rate_cards,
                    &reasons,
                    &created,
                    &rates,
                    &devices,
                    &clusters,
                ],
            )
            .await?;
        // What went in, by (workload, key); the rest conflicted with an entry
        // already stored (or earlier in this append) and is compared below.
        let mut inserted_ids: std::collections::HashMap<(i64, String), i64> = rows
            .iter()
            .map(|r| Ok(((r.try_get(1)?, r.try_get(2)?), r.try_get(0)?)))
            .collect::<Result<_, tokio_postgres::Error>>()?;
        let mut out = AppendOutcome::default();
        let mut inserted = Vec::with_capacity(entries.len());
        for (e, seq) in entries.iter().zip(&seqs) {
            if let Some(id) = inserted_ids.remove(&(*seq, e.key.clone())) {
                out.inserted += 1;
                inserted.push((e, id));
                continue;
            }
            let row = tx
                .query_one(
                    &format!(
                        "SELECT id, {COLUMNS} FROM entries WHERE workload_seq = $1 AND idempotency_key = $2"
                    ),
                    &[seq, &e.key],
                )
                .await?;
            let stored = Self::read_row(&row)?;
            if !stored.entry.same_content(e) {
                return Err(conflict(&stored.entry, e));
            }
            out.duplicates += 1;
        }
        let totals = totals_of(inserted);
        if !totals.is_empty() {
            let budgets: Vec<&str> = totals.keys().map(|(b, _)| *b).collect();
            let kinds: Vec<&str> = totals.keys().map(|(_, k)| *k).collect();
            let credits: Vec<String> = totals.values().map(|t| t.0.to_string()).collect();
            let counts: Vec<i64> = totals.values().map(|t| t.1).collect();
            let first_ids: Vec<i64> = totals.values().map(|t| t.2).collect();
            tx.execute(
                &statements.add_to_totals,
                &[&budgets, &kinds, &credits, &counts, &first_ids],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn kind_sums(&self, budget: Option<&str>) -> Result<KindSums, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                // The totals each append keeps (migration 5), not a sum over
                // millions of entries; verify compares them with the entries.
                "SELECT budget, kind, credits::TEXT, first_id FROM budget_totals WHERE ($1::TEXT IS NULL OR budget = $1)",
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
            let kind = group_kind(first_id, &k, &b)?;
            let sum: i128 = sum.parse().map_err(|_| StoreError::CorruptRow {
                id: first_id,
                column: "credits",
                detail: format!("sum {sum:?} of budget {b} is not an integer"),
            })?;
            out.entry(b).or_default().insert(kind, sum);
        }
        Ok(out)
    }

    async fn page_reader(&self, filter: &EntryFilter) -> Result<PageReader, StoreError> {
        // A connection of its own, so a scan of millions of rows neither waits
        // for nor delays the appends on the store's connection.
        let client = std::sync::Arc::new(Self::dial(&self.url).await?);
        let statement = client.prepare(&id_range_sql(filter)).await?;
        let filter = filter.clone();
        Ok(PageReader::spawn(move |pages, spare| {
            read_pages(client, statement, filter, pages, spare)
        }))
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
                &format!(
                    "SELECT id, {COLUMNS} FROM entries WHERE workload_seq = (SELECT seq FROM workload_ids WHERE uid = $1) ORDER BY id"
                ),
                &[&workload_uid],
            )
            .await?;
        rows.iter().map(Self::read_row).collect()
    }

    async fn entry_by_key(&self, key: &str) -> Result<Option<StoredEntry>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "SELECT id, {COLUMNS} FROM entries WHERE workload_seq = (SELECT seq FROM workload_ids WHERE uid = $1) AND idempotency_key = $2"
                ),
                &[&key_workload_uid(key), &key],
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
            if let Some(id) = r.try_get::<_, Option<i64>>(24)? {
                return Err(corrupt_aggregated(
                    id,
                    "credits",
                    &format!("a post of reservation {}", reserve.entry.key),
                ));
            }
            let posted: String = r.try_get(22)?;
            let posted: i128 = posted.parse().map_err(|_| StoreError::CorruptRow {
                id: reserve.id,
                column: "credits",
                detail: format!("sum {posted:?} of the posts is not an integer"),
            })?;
            let posted_until: i64 = r.try_get(23)?;
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
