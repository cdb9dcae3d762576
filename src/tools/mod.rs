//! Commands beside the gateway: `capture` records live traffic for `replay`,
//! `simulate` drives a fleet, `demo` shows it all on one screen, `status` reads
//! a running gateway's live status, `fleet` manages gateways through their
//! upstream broker (`rollout`: one document across many).

pub mod capture;
pub mod demo;
pub mod fleet;
pub mod rollout;
pub mod simulate;
pub mod status;
