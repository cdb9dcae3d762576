//! Commands beside the gateway: `capture` records live traffic for `replay`,
//! `simulate` drives a fleet, `demo` shows it all on one screen.

pub mod capture;
pub mod demo;
pub mod simulate;
