//! Checkout: starting a payment with the configured provider (to be written).
