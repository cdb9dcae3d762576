//! The pure event-time building blocks: clock-offset estimation, duplicate
//! suppression and windows. No I/O, no clock reads: time is passed in.

pub mod seq;
pub mod skew;
pub mod window;
