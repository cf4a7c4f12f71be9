//! Status checks of reconciliation (to be written).
