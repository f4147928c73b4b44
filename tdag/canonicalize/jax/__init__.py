"""The JAX front end: a function traced to a jaxpr, walked equation by equation into a Program."""
