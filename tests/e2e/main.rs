//! End-to-end tests against a real kube-apiserver with the Kueue manager.
//!
//! Built only with `--features e2e`. `e2e/test.sh` starts a local control plane
//! (see `e2e/README.md`) and runs `cargo test --features e2e --test e2e` with
//! `KUBECONFIG` set; pointing `KUBECONFIG` at any cluster with Kueue v0.17+
//! works too (kaccel refuses a Kueue older than v0.16 at start). Without a reachable cluster every test panics: nothing is skipped.

mod class_requests;
mod controller;
mod credit_finalizer;
mod dra;
mod fleet_bench;
mod health;
mod health_sources;
mod health_trends;
mod health_vendors;
mod identity;
mod instances;
mod inventory;
mod kueue_compat;
mod kueue_scenarios;
mod ledger;
mod ledger_bench;
mod ledger_crash;
mod memory_churn;
mod multikueue;
mod plan;
mod smoke;
mod support;
mod topology;
