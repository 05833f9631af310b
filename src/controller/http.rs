//! /healthz, /readyz and /metrics.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

#[derive(Clone)]
pub struct HttpState {
    pub registry: Arc<Registry>,
    /// Set once every watch cache has synced.
    pub ready: Arc<AtomicBool>,
    /// Per-device health, served at /devices (read by `kaccel inventory --health-from`).
    pub tracker: super::health_poller::SharedTracker,
    /// The DeviceTaintRules of the last reconcile, served at /devices too.
    pub held_rules: SharedHeldRules,
}

/// What the last reconcile decided to hold on single DRA devices.
pub type SharedHeldRules = Arc<std::sync::Mutex<Vec<crate::plan::device_quarantine::HeldRule>>>;

pub async fn serve(
    address: SocketAddr,
    state: HttpState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/devices", get(devices))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(address).await?;
    tracing::info!(%address, "serving /healthz, /readyz, /metrics");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    if state.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
    }
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Per-device health as the health loop sees it: every device with its status,
/// reasons, normalised fields and raw vendor fields, and every source with whether
/// it is usable and why not.
async fn devices(State(state): State<HttpState>) -> impl IntoResponse {
    let now = super::health_poller::now_seconds();
    let body = {
        let tracker = state.tracker.lock().expect("tracker lock");
        let sources: Vec<serde_json::Value> = tracker
            .sources
            .values()
            .map(|s| {
                let mut v = serde_json::to_value(s).unwrap_or_default();
                v["usable"] = serde_json::Value::Bool(s.usable(now));
                v["problem"] = serde_json::to_value(s.problem(now)).unwrap_or_default();
                v
            })
            .collect();
        let devices = tracker.device_views(now);
        let rules = state.held_rules.lock().expect("held rules lock").clone();
        serde_json::json!({
            "observedAt": now, "sources": sources, "devices": devices, "taintRules": rules,
        })
    };
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
}
