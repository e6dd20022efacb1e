//! see docs/PROTOCOL.md
