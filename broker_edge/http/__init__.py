"""What every HTTP endpoint of a broker shares: bounds on connections and requests, lazy loading."""
