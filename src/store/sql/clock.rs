//! The clock a store's statements read.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// The clock of a store's statements: the database's, unless a test moved it.
///
/// Production never moves it: every statement then binds `NULL` as `$1` and reads the
/// database clock. A test moves it forward to end leases and pass grace windows without
/// sleeping; every store cloned from the one it came from sees the move.
#[derive(Debug, Clone, Default)]
pub struct Clock(Arc<Mutex<Duration>>);

impl Clock {
    /// Moves the statements' clock `by` further ahead of the real one.
    pub fn advance(&self, by: Duration) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) += by;
    }

    /// The time statements read: `None` (the database clock) until moved.
    pub fn now(&self) -> Option<DateTime<Utc>> {
        let ahead = *self.0.lock().unwrap_or_else(|e| e.into_inner());
        (!ahead.is_zero()).then(|| Utc::now() + ahead)
    }
}
