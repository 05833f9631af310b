//! Streaming exports: plain CSV (one row per entry), FOCUS 1.2 CSV and JSON lines.
//! Writers take one entry at a time; nothing is buffered beyond the underlying
//! `Write`.
//!
//! This module holds what every format shares (the [`Format`], billing [`Pricing`]
//! and [`Parties`], errors, the [`Exporter`] that dispatches each entry and
//! [`export_entries`]); each format's columns and mapping are in its own file:
//! `export/csv.rs` (plain CSV, with the balance delta columns), `export/focus.rs`
//! (the FOCUS 1.2 mapping, column by column) and `export/json.rs`. Reading an export
//! back is `export/read.rs`.

mod csv;
mod focus;
mod json;
mod numbers;
mod read_back;
#[cfg(test)]
mod tests;

use std::io::{self, Write};

use super::entry::EntryKind;
use super::store::{EntryFilter, LedgerStore, StoredEntry, for_each_entry};
use csv::record;

pub use crate::k8s::time::rfc3339;
pub use csv::CSV_HEADER;
pub use focus::FOCUS_HEADER;
pub use read_back::{parse_decimal, read_csv, read_csv_table};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Csv,
    Focus,
    Json,
}

impl Format {
    /// The entry kinds the format writes rows for (`None`: every kind). FOCUS
    /// is a cost dataset: charges only (see `focus.rs`).
    pub fn kinds_written(self) -> Option<&'static [EntryKind]> {
        match self {
            Format::Focus => Some(&[EntryKind::Post, EntryKind::Correction]),
            Format::Csv | Format::Json => None,
        }
    }

    /// `filter` narrowed to the kinds the format writes: the store leaves the
    /// rest out of what it reads (in the 10M-entry bench store, a fifth of the
    /// entries are grants, reservations and voids, which cost as much to fetch
    /// and decode as the charges).
    pub fn narrow(self, filter: &EntryFilter) -> EntryFilter {
        let mut narrowed = filter.clone();
        if let Some(written) = self.kinds_written() {
            narrowed.kinds = Some(match &filter.kinds {
                None => written.to_vec(),
                Some(asked) => asked
                    .iter()
                    .copied()
                    .filter(|k| written.contains(k))
                    .collect(),
            });
        }
        narrowed
    }
}

/// Billing currency and price of one credit in it, for FOCUS exports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pricing {
    /// ISO 4217 code, e.g. "EUR".
    pub currency: String,
    /// Price of one credit in the billing currency, in millionths (0.5 → 500000).
    pub micro_price: u64,
}

/// Who provides, publishes and invoices the devices, for FOCUS's mandatory
/// ProviderName, PublisherName and InvoiceIssuerName.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parties {
    pub provider: String,
    pub publisher: String,
    pub invoice_issuer: String,
}

/// The provider's default name: the platform itself.
pub const DEFAULT_PROVIDER: &str = "kaccel";

impl Default for Parties {
    fn default() -> Self {
        Parties {
            provider: DEFAULT_PROVIDER.into(),
            publisher: DEFAULT_PROVIDER.into(),
            invoice_issuer: DEFAULT_PROVIDER.into(),
        }
    }
}

impl Parties {
    /// The publisher and invoice issuer default to the provider.
    pub fn new(
        provider: &str,
        publisher: Option<&str>,
        invoice_issuer: Option<&str>,
    ) -> Result<Self, ExportError> {
        let check = |flag: &'static str, value: &str| {
            if value.trim().is_empty() || value.chars().any(char::is_control) {
                Err(ExportError::Party {
                    flag,
                    value: value.into(),
                })
            } else {
                Ok(value.to_string())
            }
        };
        Ok(Parties {
            provider: check("--provider", provider)?,
            publisher: check("--publisher", publisher.unwrap_or(provider))?,
            invoice_issuer: check("--invoice-issuer", invoice_issuer.unwrap_or(provider))?,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(
        "billing currency {0:?} is not an ISO 4217 code (three capital letters, e.g. EUR or USD)"
    )]
    Currency(String),
    #[error("credit price {0:?} is not a non-negative decimal with at most 6 places, e.g. \"0.5\"")]
    Price(String),
    #[error(
        "{flag} {value:?} is not a usable FOCUS name: give a non-empty name without control characters, e.g. {flag} \"ML Platform\""
    )]
    Party { flag: &'static str, value: String },
    #[error(
        "ledger entry id {id} ({key}): its FOCUS {column} does not fit 128-bit decimal arithmetic; export with a smaller --credit-price"
    )]
    Overflow {
        id: i64,
        key: String,
        column: &'static str,
    },
    #[error(
        "ledger entry id {id} ({key}): {units} device(s) from {start} to {end} (unix seconds) is more device-hours than 128-bit arithmetic holds; no reservation lasts that long, so the store holds a damaged row: find it with `kaccel ledger verify`"
    )]
    Interval {
        id: i64,
        key: String,
        units: u64,
        start: i64,
        end: i64,
    },
    #[error("cannot write the export: {0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Store(#[from] super::store::StoreError),
}

impl Pricing {
    pub fn new(currency: &str, price: &str) -> Result<Self, ExportError> {
        if currency.len() != 3
            || !currency.bytes().all(|b| b.is_ascii_uppercase())
            || currency == "XXX"
        {
            return Err(ExportError::Currency(currency.into()));
        }
        let micro_price = price
            .parse::<crate::api::Credits>()
            .map_err(|_| ExportError::Price(price.into()))?
            .0;
        Ok(Pricing {
            currency: currency.into(),
            micro_price,
        })
    }
}

/// A streaming writer for one format.
pub struct Exporter<W: Write> {
    out: W,
    format: Format,
    pricing: Pricing,
    parties: Parties,
    rows: u64,
    /// The buffer each computed field is built in (csv::Fields).
    scratch: String,
    /// The billing period of the last FOCUS row.
    billing_month: Option<focus::BillingMonth>,
}

impl<W: Write> Exporter<W> {
    /// Writes the header (CSV formats) and returns the writer.
    pub fn new(mut out: W, format: Format, pricing: Pricing, parties: Parties) -> io::Result<Self> {
        match format {
            Format::Csv => record(&mut out, &CSV_HEADER)?,
            Format::Focus => record(&mut out, &FOCUS_HEADER)?,
            Format::Json => {}
        }
        Ok(Exporter {
            out,
            format,
            pricing,
            parties,
            rows: 0,
            scratch: String::with_capacity(256),
            billing_month: None,
        })
    }

    /// Rows written so far (entries skipped by the FOCUS mapping do not count).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    pub fn write(&mut self, s: &StoredEntry) -> Result<(), ExportError> {
        match self.format {
            Format::Csv => self.csv(s)?,
            Format::Focus => self.focus(s)?,
            Format::Json => self.json(s)?,
        }
        Ok(())
    }

    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// The device-hours of an entry's interval, in micro-device-hours, or the error
/// naming the entry whose interval no arithmetic holds.
fn entry_micro_device_hours(s: &StoredEntry) -> Result<i128, ExportError> {
    let e = &s.entry;
    numbers::micro_device_hours(e.device_units, e.start, e.end).ok_or_else(|| {
        ExportError::Interval {
            id: s.id,
            key: e.key.clone(),
            units: e.device_units,
            start: e.start,
            end: e.end,
        }
    })
}

/// Streams the matching entries into `out` in `format`; returns the rows written.
/// (`kaccel ledger export`, src/cli/ledger.rs, maps its `--format` onto this.)
pub async fn export_entries<S: LedgerStore, W: Write>(
    store: &S,
    filter: &EntryFilter,
    format: Format,
    pricing: Pricing,
    parties: Parties,
    out: W,
) -> Result<u64, String> {
    let mut ex = Exporter::new(out, format, pricing, parties).map_err(|e| e.to_string())?;
    for_each_entry(store, &format.narrow(filter), |e| ex.write(e))
        .await
        .map_err(|e| e.to_string())?;
    let rows = ex.rows();
    ex.finish().map_err(|e| e.to_string())?;
    Ok(rows)
}
