//! The journal's rules, free of transport and storage: the state machine, request hashing,
//! leases and fencing tokens, the action policy, access control, and data protection
//! (personal data and secrets in keys, opaque derived keys, result sanitizing).

pub mod access;
pub mod canonical;
pub mod derived_key;
pub mod error;
pub mod escalation;
pub mod lease;
pub mod model;
pub mod policy;
mod policy_file;
pub mod result;
pub mod sensitive;
pub mod transition;
