// rayprof API docs: Swagger UI from the files the service ships, nothing from elsewhere.
// The schema and "Try it out" requests carry the token the console keeps for this tab.
"use strict";

window.addEventListener("DOMContentLoaded", () => {
  window.ui = SwaggerUIBundle({
    url: "openapi.json",
    dom_id: "#swagger-ui",
    validatorUrl: null, // the default sends the schema to an outside validator
    requestInterceptor: (request) => {
      const token = sessionStorage.getItem("rayprof-token");
      if (token) request.headers.Authorization = `Bearer ${token}`;
      return request;
    },
  });
});
