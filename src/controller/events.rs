//! Kubernetes Events: advisory, so a refused one is logged and counted, never fatal.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use serde_json::Value;

use super::diff::ObjectRef;
use super::metrics::{Metrics, ReasonLabel};
use super::reconcile::Reconciler;

impl Reconciler {
    /// An Event on a cluster-scoped Kueue object kaccel writes (a flavor, a
    /// Topology).
    pub(super) async fn event_for_object(
        &self,
        target: &ObjectRef,
        type_: EventType,
        reason: &str,
        note: &str,
    ) {
        let reference = ObjectReference {
            api_version: Some(crate::k8s::resources::kueue_api_version()),
            kind: Some(target.kind.as_str().into()),
            name: Some(target.name.clone()),
            ..Default::default()
        };
        self.publish(&reference, type_, reason, note).await;
    }

    pub(super) async fn event_for_queue(
        &self,
        object: &Value,
        type_: EventType,
        reason: &str,
        note: &str,
    ) {
        let reference = ObjectReference {
            api_version: Some(crate::k8s::resources::kueue_api_version()),
            kind: Some("ClusterQueue".into()),
            name: object["metadata"]["name"].as_str().map(str::to_string),
            ..Default::default()
        };
        self.publish(&reference, type_, reason, note).await;
    }

    pub(super) async fn publish(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: &str,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        publish_event(&self.recorder, &self.metrics, &event, reference).await;
    }
}

/// Writes an Event. A failure does not fail the reconcile (Events are advisory),
/// but it is logged at warn and counted, so a missing RBAC verb does not go unseen.
pub(crate) async fn publish_event(
    recorder: &Recorder,
    metrics: &Metrics,
    event: &Event,
    reference: &ObjectReference,
) {
    if let Err(e) = recorder.publish(event, reference).await {
        let reason = match &e {
            kube::Error::Api(status) if !status.reason.is_empty() => status.reason.clone(),
            kube::Error::Api(status) => format!("HTTP{}", status.code),
            _ => "Unreachable".to_string(),
        };
        tracing::warn!(error = %e, %reason, event_reason = %event.reason, object = ?reference.name, "could not write a Kubernetes Event (check the role grants create on events)");
        metrics
            .event_write_failures
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Client;
    use kube::runtime::events::Reporter;
    use prometheus_client::registry::Registry;

    /// An API server that refuses everything as RBAC does for a missing verb.
    async fn forbidding_api_server() -> Client {
        let app = axum::Router::new().fallback(|| async {
            (
                axum::http::StatusCode::FORBIDDEN,
                [("content-type", "application/json")],
                r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"events.events.k8s.io is forbidden: User \"kaccel\" cannot create resource \"events\"","reason":"Forbidden","code":403}"#,
            )
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let config = kube::Config::new(url.parse().unwrap());
        Client::try_from(config).unwrap()
    }

    #[tokio::test]
    async fn a_refused_event_is_counted_by_reason() {
        let client = forbidding_api_server().await;
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: "kaccel".into(),
                instance: None,
            },
        );
        let metrics = Metrics::register(&mut Registry::default());
        let event = Event {
            type_: EventType::Normal,
            reason: "FlavorCreated".into(),
            note: None,
            action: "Reconcile".into(),
            secondary: None,
        };
        let reference = ObjectReference {
            kind: Some("Node".into()),
            name: Some("n1".into()),
            ..Default::default()
        };
        publish_event(&recorder, &metrics, &event, &reference).await;
        publish_event(&recorder, &metrics, &event, &reference).await;
        let forbidden = ReasonLabel {
            reason: "Forbidden".into(),
        };
        assert_eq!(
            metrics.event_write_failures.get_or_create(&forbidden).get(),
            2
        );
    }
}
