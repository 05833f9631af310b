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
    /// No connection is kept between polls. An exporter polled every few seconds
    /// would hold an idle connection and its buffers the whole time: against
    /// fake exporters that keep connections open (as dcgm-exporter does), the
    /// fleet bench's kaccel held 110.2 MiB during the changes with 500 of them
    /// pooled, against 96.8-98.5 MiB in four runs without, while its quiet
    /// minute's CPU did not show the saved connects (3,740 ms against
    /// 3,720-4,940 ms). A plain-HTTP connect every interval costs the exporter
    /// and kaccel next to nothing.
    fn default() -> Self {
        Scraper {
            client: Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(0)
                .build_http(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An exporter that keeps connections open (no `Connection: close`), as
    /// dcgm-exporter does, still gets a connection per poll: none is held idle
    /// between polls.
    #[tokio::test]
    async fn no_connection_is_held_between_polls() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/metrics", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    // One answer per request head, the connection kept open.
                    while let Ok(n) = conn.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        let body = "up 1\n";
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if conn.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let scraper = Scraper::default();
        for _ in 0..3 {
            let body = scraper
                .fetch(&url, Duration::from_secs(5), 1024)
                .await
                .unwrap();
            assert_eq!(body, "up 1\n");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }
}
