//! The model zoo (written below).
