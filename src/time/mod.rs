//! The pure event-time building blocks: clock-offset estimation, duplicate
//! suppression, the group watermark fold and windows. No I/O, no clock reads: time is passed in.

pub mod seq;
pub mod skew;
pub mod watermark;
pub mod window;
