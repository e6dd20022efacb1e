use super::RateControl;

/// A constant, user-chosen rate (Tsunami's `set rate`), or none.
#[derive(Debug, Clone)]
pub struct Fixed {
    rate: Option<u64>,
}

impl Fixed {
    /// Paces at `rate` bytes/s; `None`: unpaced.
    pub fn new(rate: Option<u64>) -> Self {
        Fixed { rate }
    }
}

impl RateControl for Fixed {
    fn pacing_rate(&self) -> Option<u64> {
        self.rate
    }

    fn name(&self) -> &'static str {
        if self.rate.is_some() {
            "fixed"
        } else {
            "max"
        }
    }

    /// The rate set is the rate sent on average.
    fn makes_up_stalls(&self) -> bool {
        true
    }
}
