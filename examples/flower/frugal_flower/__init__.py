"""frugal on Flower: federated training of the digits across clients with their own memory budgets."""
