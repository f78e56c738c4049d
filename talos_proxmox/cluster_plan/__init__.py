"""What each resource is made from, derived from the settings: resource inputs, the patches the program derives per node, and the Helm values of the add-ons."""
