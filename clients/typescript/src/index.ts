// The package's public surface: everything a user imports comes from here.
export const VERSION = "0.1.0";
