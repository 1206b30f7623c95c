//! protocol (placeholder)
