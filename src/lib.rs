//! kaccel: a mixed fleet of GPUs and NPUs behind Kueue.
//!
//! Data flows one way: `api` (our CRDs) and `inventory`/`health` (what the fleet
//! is) feed `plan` (pure), whose output the `controller` applies. `ledger` prices
//! what Kueue admitted. `cli` is the binary's front door.

pub mod api;
pub mod cli;
pub mod controller;
pub mod crds;
pub mod health;
pub mod inventory;
pub mod k8s;
pub mod kueue;
pub mod ledger;
pub mod plan;
#[doc(hidden)]
pub mod testkit;
pub mod webhook;
