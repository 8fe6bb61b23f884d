"""Policy files, their compilation to Casbin, and the decision engine."""
