//! Commands beside the gateway: `capture` records live traffic for `replay`,
//! `simulate` drives a fleet, `demo` shows it all on one screen, `status` reads
//! a running gateway's live status.

pub mod capture;
pub mod demo;
pub mod simulate;
pub mod status;
