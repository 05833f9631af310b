//! Fetching an exporter's `/metrics` over plain HTTP (exporters serve it on the node
//! network), with a deadline and a size cap: a hung, dribbling or huge source is an
//! error, never a stall. The deadline covers the whole answer (connect, headers and
//! every byte of the body), so an exporter sending a byte a second is cut at it too;
//! a body is read only up to the cap, so memory stays bounded whatever it sends.

use std::time::Duration;

use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::prom::MAX_BODY_BYTES;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScrapeError {
    #[error("invalid URL {0:?}: use http://host:port/metrics")]
    Url(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("unreachable: {0}")]
    Connect(String),
    #[error("answered HTTP {0}")]
    Status(u16),
    #[error("answer longer than {0} bytes (maxResponseBytes): cut off unread")]
    TooLarge(usize),
    #[error("body unreadable: {0}")]
    Body(String),
}

#[derive(Clone)]
pub struct Scraper {
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Default for Scraper {
    fn default() -> Self {
        Scraper {
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }
}

impl Scraper {
    /// `GET url`: the body of a 200 answer; any other status is an error.
    pub async fn fetch(
        &self,
        url: &str,
        timeout: Duration,
        max_bytes: usize,
    ) -> Result<String, ScrapeError> {
        match self.get(url, timeout, max_bytes).await? {
            (200, body) => Ok(body),
            (status, _) => Err(ScrapeError::Status(status)),
        }
    }

    /// `GET url`: the status and the body, whatever the status (a Prometheus query
    /// API explains a 4xx/5xx in its JSON body). Same deadline and size cap
    /// (`max_bytes`, itself capped at the parser's [`MAX_BODY_BYTES`]).
    pub async fn get(
        &self,
        url: &str,
        timeout: Duration,
        max_bytes: usize,
    ) -> Result<(u16, String), ScrapeError> {
        let max_bytes = max_bytes.min(MAX_BODY_BYTES);
        let uri: hyper::Uri = url.parse().map_err(|_| ScrapeError::Url(url.into()))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(ScrapeError::Url(url.into()));
        }
        let request = async {
            let response = self
                .client
                .get(uri)
                .await
                .map_err(|e| ScrapeError::Connect(e.to_string()))?;
            let status = response.status().as_u16();
            let body = Limited::new(response.into_body(), max_bytes)
                .collect()
                .await
                .map_err(|e| {
                    if e.downcast_ref::<LengthLimitError>().is_some() {
                        ScrapeError::TooLarge(max_bytes)
                    } else {
                        ScrapeError::Body(e.to_string())
                    }
                })?
                .to_bytes();
            let text = String::from_utf8(body.to_vec())
                .map_err(|_| ScrapeError::Body("not UTF-8".into()))?;
            Ok((status, text))
        };
        tokio::time::timeout(timeout, request)
            .await
            .map_err(|_| ScrapeError::Timeout(timeout))?
    }
}
