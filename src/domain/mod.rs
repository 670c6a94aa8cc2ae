//! The journal's rules, free of transport and storage: the state machine, request hashing,
//! leases and fencing tokens, and the action policy.

pub mod canonical;
pub mod error;
pub mod lease;
pub mod model;
pub mod policy;
mod policy_file;
