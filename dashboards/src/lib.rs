//! stallwatch dashboards (filled by its issue).
