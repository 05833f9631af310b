//! The planner's naming helpers live on the ground floor, [`crate::k8s::names`];
//! re-exported here for the planner's own modules.

pub use crate::k8s::names::*;
